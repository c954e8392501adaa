// The three OptimizerStateStores of ZeRO-3 (see stage3_optimizer_states.h).
#include "runtime/zero/stage3_optimizer_states.h"

#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include "deepspeed/optimizers.h"
#include "runtime/swap/optimizer_swapper.h"
#include "util/check.h"

namespace deepspeed::runtime {

void OptimizerStateStore::step(const std::function<void(size_t)>& step_one) {
  for (size_t i = 0; i < sub_groups_->size(); ++i) step_one(i);
}

namespace {

// offload_optimizer.device "none": masters and state stay where the model is.
class InMemoryOptimizerStates final : public OptimizerStateStore {
 public:
  explicit InMemoryOptimizerStates(std::vector<Stage3SubGroup>* sub_groups)
      : OptimizerStateStore(sub_groups) {}
};

// offload_optimizer.device "cpu": the offloaded sub-groups' masters and state in host memory.
class HostOptimizerStates : public OptimizerStateStore {
 public:
  HostOptimizerStates(std::vector<Stage3SubGroup>* sub_groups, torch::optim::Optimizer* optimizer,
                      const OffloadOptimizerConfig& offload, std::string source)
      : OptimizerStateStore(sub_groups), optimizer_(optimizer), offload_(offload),
        source_(std::move(source)) {}

  bool offloads() const override { return true; }

  // offload_optimizer.ratio (ZeRO-Offload++ "Twin-Flow", stage 3 only, as in DeepSpeed): the
  // sub-groups are offloaded in order while the elements placed so far plus the next
  // sub-group's stay below ratio x all of this rank's elements; the rest keep master and state
  // on the device. A CPU-only build steps both parts on the CPU with the same kernel, so ratio
  // changes where the memory report counts them and which ones NVMe swaps, not the numbers.
  void place() override {
    const auto& groups = *sub_groups_;
    offloaded_.assign(groups.size(), true);
    if (offload_.ratio >= 1.0) return;
    int64_t total = 0;
    for (const auto& sg : groups) total += sg.numel;
    int64_t placed = 0;
    for (size_t k = 0; k < groups.size(); ++k) {
      offloaded_[k] = static_cast<double>(placed + groups[k].numel) <
                      offload_.ratio * static_cast<double>(total);
      placed += groups[k].numel;
    }
    ds_optimizer_ = dynamic_cast<optim::DsOptimizer*>(optimizer_);
    DS_CHECK(ds_optimizer_ != nullptr, ConfigError, source_,
             ": zero_optimization.offload_optimizer.ratio < 1 needs the optimizer from the "
             "config's \"optimizer\" section (its state is split between device and host)");
  }

  // Master copies and optimizer state of the offloaded sub-groups now in memory.
  void report(ZeroMemory& m) const override {
    const auto& groups = *sub_groups_;
    int64_t bytes = 0;
    for (size_t k = 0; k < groups.size(); ++k) {
      const Stage3SubGroup& sg = groups[k];
      if (offloaded_[k] && !sg.model_flat.is_same(sg.master)) {
        bytes += static_cast<int64_t>(sg.master.element_size()) * sg.master.numel();
      }
    }
    // Without a per-parameter view (ratio 1 with any optimizer): all of its state is offloaded.
    if (ds_optimizer_ == nullptr) {
      m.offloaded_optimizer_bytes = bytes + optimizer_state_bytes(*optimizer_);
      return;
    }
    for (size_t k = 0; k < groups.size(); ++k) {
      if (!offloaded_[k]) continue;
      if (const optim::ParamState* state = ds_optimizer_->find_state(groups[k].master)) {
        for (const auto& [name, t] : state->tensors) {
          if (t.defined()) bytes += t.numel() * static_cast<int64_t>(t.element_size());
        }
      }
    }
    m.offloaded_optimizer_bytes = bytes;
  }

 protected:
  torch::optim::Optimizer* optimizer_;
  const OffloadOptimizerConfig& offload_;
  std::string source_;
  std::vector<bool> offloaded_;                  // per sub-group (offload_optimizer.ratio)
  optim::DsOptimizer* ds_optimizer_ = nullptr;  // set with NVMe offload or ratio < 1
};

// offload_optimizer.device "nvme". Note [NVMe sub-groups]: each offloaded sub-group's fp32
// master and optimizer state tensors form one swapper sub-group (runtime/swap/
// optimizer_swapper.h), written out by start() and brought back only for that sub-group's
// step, with read-ahead of the next and write-behind of the last
// (offload_optimizer.pipeline_read/write). The state must exist to be swapped, so it is
// created up front (zeros, as the first step would); the gradients and the model-dtype shards
// stay in memory, as in DeepSpeed.
class NvmeOptimizerStates final : public HostOptimizerStates {
 public:
  NvmeOptimizerStates(std::vector<Stage3SubGroup>* sub_groups, torch::optim::Optimizer* optimizer,
                      const OffloadOptimizerConfig& offload, const DeepSpeedConfig& config,
                      int global_rank)
      : HostOptimizerStates(sub_groups, optimizer, offload, config.source),
        aio_(config.aio), global_rank_(global_rank) {}

  bool swaps_masters() const override { return true; }

  void start(const std::function<void(size_t)>& make_master) override {
    ds_optimizer_ = dynamic_cast<optim::DsOptimizer*>(optimizer_);
    DS_CHECK(ds_optimizer_ != nullptr, ConfigError, source_,
             ": zero_optimization.offload_optimizer.device \"nvme\" needs the optimizer from the "
             "config's \"optimizer\" section (its state is created up front and swapped); a "
             "client optimizer cannot be swapped");
    swap::SwapperOptions so;
    so.nvme_path = offload_.nvme_path;
    so.rank = global_rank_;  // swap files are per process: model-parallel peers share dp ranks
    so.buffer_count = offload_.buffer_count;
    so.pipeline_read = offload_.pipeline_read;
    so.pipeline_write = offload_.pipeline_write;
    so.aio = aio::AioOptions::from_config(aio_, source_);
    swapper_ = std::make_unique<swap::OptimizerSwapper>(so);
    auto& groups = *sub_groups_;
    swap_id_.assign(groups.size(), -1);
    for (size_t k = 0; k < groups.size(); ++k) {
      Stage3SubGroup& sg = groups[k];
      // One master at a time: made from the shards, written out with its state, released.
      make_master(k);
      if (!offloaded_[k]) continue;  // ratio < 1: stays on the device
      optim::ParamState& state = ds_optimizer_->get_or_create_state(
          sg.master, ds_optimizer_->group_options(sg.param_group));
      std::vector<swap::NamedTensor> tensors{{"fp32", sg.master}};
      for (auto& [name, t] : state.tensors) {
        if (t.defined()) tensors.push_back({name, t});
      }
      swap_handles_.push_back(tensors);
      swap_id_[k] = swapper_->add_sub_group(std::move(tensors));
      swapped_sub_group_.push_back(k);
    }
  }

  void step(const std::function<void(size_t)>& step_one) override {
    // The sub-groups ratio < 1 keeps on the device first, then the swapped ones in the
    // swapper's pipeline.
    for (size_t i = 0; i < swap_id_.size(); ++i) {
      if (swap_id_[i] < 0) step_one(i);
    }
    swapper_->step_sub_groups(
        [&](int id) { step_one(swapped_sub_group_[static_cast<size_t>(id)]); });
  }

  void swap_in_all() override { swapper_->swap_in_all(); }

  void swap_out_all() override {
    // A checkpoint load may have replaced state tensors with tensors of its own; the swapper
    // moves the ones it registered, so the loaded values go into those.
    at::NoGradGuard no_grad;
    for (size_t id = 0; id < swapped_sub_group_.size(); ++id) {
      optim::ParamState* state =
          ds_optimizer_->find_state((*sub_groups_)[swapped_sub_group_[id]].master);
      if (state == nullptr) continue;
      for (auto& [name, t] : state->tensors) {
        for (auto& registered : swap_handles_[id]) {
          if (registered.name != name || !t.defined() || t.is_same(registered.tensor)) continue;
          registered.tensor.copy_(t);
          t = registered.tensor;
        }
      }
    }
    swapper_->swap_out_all();
  }

  void report(ZeroMemory& m) const override {
    HostOptimizerStates::report(m);
    m.nvme_optimizer_bytes = swapper_->swapped_bytes();
    m.swap_buffer_bytes += swapper_->buffer_bytes();
  }

 private:
  const AioConfig& aio_;
  int global_rank_;
  std::vector<int> swap_id_;                                  // per sub-group, -1: not swapped
  std::vector<size_t> swapped_sub_group_;                     // per swapper id
  std::vector<std::vector<swap::NamedTensor>> swap_handles_;  // per swapper id
  std::unique_ptr<swap::OptimizerSwapper> swapper_;
};

}  // namespace

std::unique_ptr<OptimizerStateStore> make_optimizer_state_store(
    const DeepSpeedConfig& config, std::vector<Stage3SubGroup>* sub_groups,
    torch::optim::Optimizer* optimizer, int global_rank) {
  const auto& z = config.zero_optimization;
  switch (z.optimizer_offload()) {
    case OffloadDevice::kCpu:
      return std::make_unique<HostOptimizerStates>(sub_groups, optimizer, *z.offload_optimizer,
                                                   config.source);
    case OffloadDevice::kNvme:
      return std::make_unique<NvmeOptimizerStates>(sub_groups, optimizer, *z.offload_optimizer,
                                                   config, global_rank);
    case OffloadDevice::kNone:
      break;
  }
  return std::make_unique<InMemoryOptimizerStates>(sub_groups);
}

}  // namespace deepspeed::runtime
