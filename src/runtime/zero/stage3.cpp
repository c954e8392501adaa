// ZeRO stage 3 (reference §7.6-7.8): parameters, gradients and optimizer states partitioned.
// Construction partitions every parameter (adopting zero::Init's shards), lays the trainable
// shards out in sub-groups, finds the units and hands them to the ParamCoordinator, and arms the
// gradient reduce-scatter. The step works sub-group by sub-group; afterwards only the
// persistent parameters are gathered again (the others are gathered when their unit runs).
#include <algorithm>
#include <exception>
#include <map>
#include <set>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "deepspeed/auto_ep.h"
#include "deepspeed/comm.h"
#include "deepspeed/linear.h"
#include "deepspeed/moe.h"
#include "deepspeed/muon.h"
#include "deepspeed/optimizers.h"
#include "runtime/checkpoint/shared_file_writers.h"
#include "runtime/grad_clip.h"
#include "runtime/optim/scoped_grad_scale.h"
#include "runtime/host_caching_allocator.h"
#include "runtime/zero/host_offload.h"
#include "runtime/zero/moe_param_groups.h"
#include "runtime/precision/overflow_check.h"
#include "runtime/zero/stage3_nvme_shards.h"
#include "runtime/zero/stage3_optimizer_states.h"
#include "runtime/zero/stage3.h"
#include "runtime/zero/stage3_grad_reducer.h"
#include "runtime/zero/stage3_init.h"
#include "runtime/zero/stage3_muon.h"
#include "runtime/zero/stage3_units.h"
#include "util/check.h"
#include "util/env.h"
#include "util/logging.h"

namespace deepspeed::runtime {
namespace {

void check_config(const DeepSpeedConfig& cfg) {
  const auto& z = cfg.zero_optimization;
  // Matches DeepSpeed's stage-3 assertions (reference §7.1).
  DS_CHECK(cfg.gradient_predivide_factor == 1.0, ConfigError, cfg.source,
           ": gradient_predivide_factor != 1.0 is not yet supported with ZeRO-3");
  DS_CHECK(!cfg.prescale_gradients, ConfigError, cfg.source,
           ": pre-scale gradients (prescale_gradients) is not yet supported with ZeRO-3");
  DS_CHECK(z.stage3_module_granularity_threshold == 0, NotSupportedError, cfg.source,
           ": zero_optimization.stage3_module_granularity_threshold ",
           z.stage3_module_granularity_threshold,
           " is not supported: units are the model's zero::Unit modules and Sequential "
           "children, each already gathered with all its descendants (see docs/zero.md)");
}

const c10::TensorImpl* key(const at::Tensor& t) { return t.unsafeGetTensorImpl(); }

bool reduce_scatter_on_cpu_for_tests() {
  return env::get("DS_TEST_STAGE3_REDUCE_SCATTER_ON_CPU").value_or("") == "1";
}

class Stage3 final : public Stage3ZeroOptimizer {
 public:
  explicit Stage3(const ZeroContext& ctx)
      : config_(*ctx.config), optimizer_(ctx.optimizer), module_(ctx.module),
        broadcast_group_(ctx.dp_group), dp_group_(ctx.mics ? ctx.mics->shard : ctx.dp_group),
        replica_group_(ctx.mics ? ctx.mics->replica : comm::self_group("mics_replica")),
        gather_group_(dp_group_), world_(dp_group_.size()), rank_(dp_group_.rank()),
        average_divisor_(ctx.average_divisor > 0 ? ctx.average_divisor : ctx.dp_group.size()),
        model_dtype_(ctx.model_dtype),
        grad_accum_dtype_(ctx.grad_accum_dtype), communication_dtype_(ctx.communication_dtype),
        comm_dtypes_(ctx.comm_dtypes) {
    DS_INTERNAL_ASSERT(module_ != nullptr, "ZeRO-3 needs the model");
    check_config(config_);
    if (ctx.mics && ctx.mics->hierarchical()) {
      gather_group_.inter_node = ctx.mics->inter_node;
      gather_group_.intra_node = ctx.mics->intra_node;
    }
    if (ctx.hpz_group) gather_group_.secondary = *ctx.hpz_group;
    qgz_groups_ = ctx.qgz_groups;
    find_expert_partition(ctx);
    // offload_optimizer "cpu": the fp32 shards and optimizer state in host memory, stepped by
    // the CPU optimizer (the config's optimizer is built as DeepSpeed's CPU variant). A
    // CPU-only build keeps them there already. "nvme": in swap files between steps as well
    // (Note [NVMe sub-groups]). The store for the device is chosen here, once.
    optimizer_states_ = make_optimizer_state_store(config_, &sub_groups_, optimizer_, global_rank());
    at::NoGradGuard no_grad;
    const auto& z = config_.zero_optimization;
    UnitDiscovery found = discover_units(module_);
    collect_params();
    std::vector<Stage3Unit> units = map_units(found);
    choose_persistent(found, units);
    std::vector<std::vector<size_t>> group_params = map_param_groups();
    at::TensorOptions options = params_.empty() ? at::TensorOptions() : params_[0].param.options();
    const bool param_offload = param_device_ != OffloadDevice::kNone;
    // ZeRO-Offload with the model on a GPU: the masters, their gradients and the optimizer
    // state live in pinned host memory (CPU-Adam steps them there), and with offload_param the
    // shards too, which then cross to the device to be gathered. On CPU everything is host
    // memory already.
    const bool on_gpu = !options.device().is_cpu();
    const at::TensorOptions host = options.device(at::kCPU).pinned_memory(on_gpu);
    const at::TensorOptions state_options =
        on_gpu && (optimizer_states_->offloads() || param_offload) ? host : options;
    shard_options_ = on_gpu && param_offload ? host : options;
    SubGroupAllocation allocation;
    const bool param_nvme = param_device_ == OffloadDevice::kNvme;
    allocation.separate_master = optimizer_states_->swaps_masters() || param_nvme;
    allocation.own_shards = param_nvme;
    allocation.deferred = optimizer_states_->swaps_masters() || param_nvme;
    allocation.master_dtype = ctx.master_dtype;
    sub_groups_ = build_sub_groups(group_params, params_, z.sub_group_size, model_dtype_,
                                   grad_accum_dtype_, state_options, allocation, shard_options_);
    fill_shards();
    optimizer_states_->place();
    // A store that swaps the masters makes each in turn (start() below); otherwise they are
    // made now.
    const auto make_master = [&](size_t k) {
      if (allocation.deferred) {
        sub_groups_[k].master.set_data(
            at::zeros({sub_groups_[k].numel}, state_options.dtype(allocation.master_dtype)));
      }
      shards_to_master(k);
    };
    if (!optimizer_states_->swaps_masters()) {
      for (size_t k = 0; k < sub_groups_.size(); ++k) make_master(k);
    }
    for (size_t g = 0; g < optimizer_->param_groups().size(); ++g) {
      std::vector<at::Tensor> masters;
      for (const auto& sg : sub_groups_) {
        if (sg.param_group == g) masters.push_back(sg.master);
      }
      optimizer_->param_groups()[g].params() = std::move(masters);
    }
    if (auto* muon = dynamic_cast<optim::Muon*>(optimizer_)) {
      muon_ = std::make_unique<Stage3Muon>(*muon, sub_groups_, z.reduce_bucket_numel());
    }
    optimizer_states_->start(make_master);
    start_coordinator(std::move(units), found);
    if (param_nvme) start_shard_store();
    // Gradients last: by now the shards and masters that NVMe offload swaps are on disk.
    if (allocation.deferred) {
      for (auto& sg : sub_groups_) allocate_grad(sg, grad_accum_dtype_, state_options);
    }
    // What NVMe offload swapped out is free now: give it back to the system rather than keep it
    // cached for reuse (the point was to need less memory).
    if (allocation.deferred) empty_host_cache();
    start_reducers();
  }

  ~Stage3() override {
    for (const auto& u : coordinator_->units()) unregister_unit(u.module);
    if (shard_store_) {
      leave_partitioned();
      coordinator_->set_shard_store(nullptr);
      return;
    }
    // The model may outlive the engine: leave it whole (every rank destroys its engine at the
    // same point, so this gather is collective like the rest).
    try {
      if (std::uncaught_exceptions() == 0) {
        at::NoGradGuard no_grad;
        for (size_t i = 0; i < params_.size(); ++i) coordinator_->gather_now(i);
      }
    } catch (const std::exception& e) {
      log::warn(std::string("ZeRO-3: could not gather the parameters back on engine "
                            "destruction; the model stays partitioned: ") + e.what());
    }
    coordinator_->set_shard_store(nullptr);  // the store goes with this engine
  }

  void begin_backward(bool /*boundary*/) override {
    // Matches DeepSpeed: stage 3 reduce-scatters in every micro-step's backward.
    for (auto& r : reducers_) r->prepare();
  }

  void end_backward(bool boundary) override {
    for (auto& r : reducers_) {
      if (r->armed()) r->finish();
    }
    coordinator_->end_iteration();
    if (boundary) all_reduce_across_replicas();
  }

  void before_grad_norm(double loss_scale) override {
    if (muon_) muon_->orthogonalize(sub_groups_, params_, dp_group_, loss_scale);
  }

  double grad_norm_squared() override {
    std::vector<at::Tensor> grads;
    for (const auto& sg : sub_groups_) grads.push_back(sg.grad);
    return sum_over_group(squared_l2_norm(grads), dp_group_);
  }

  void scale_gradients(double coef) override {
    // A DeepSpeed optimizer scales each gradient as its step reads it (Note [Gradient scale in
    // the step]): with offload the sub-groups' gradients are host memory, and this saves a pass.
    if (ScopedGradScale::takes_scale(optimizer_)) {
      step_grad_scale_ *= coef;
      return;
    }
    for (auto& sg : sub_groups_) sg.grad.mul_(coef);
  }

  void optimizer_step() override {
    wait_for_shard_copies();  // the step rewrites the host shards the copies read
    {
      ScopedGradScale scale(optimizer_, step_grad_scale_);
      step_grad_scale_ = 1.0;  // it belongs to these gradients alone
      optimizer_states_->step([this](size_t i) { step_sub_group(i); });
    }
    refresh_gathered_params();
  }

  void zero_grad() override {
    for (auto& sg : sub_groups_) sg.grad.zero_();
    for (auto& r : reducers_) r->shards_zeroed();
    for (auto& p : params_) {
      at::Tensor handle = p.param;
      if (handle.grad().defined()) handle.mutable_grad() = at::Tensor();
    }
  }

  void loss_scale_updated(bool overflow, double ratio) override {
    for (auto& r : reducers_) r->loss_scale_updated(overflow, ratio);
  }

  bool local_overflow() override {
    std::vector<at::Tensor> grads;
    for (const auto& sg : sub_groups_) grads.push_back(sg.grad);
    return has_inf_or_nan(grads);
  }

  ZeroMemory memory() const override {
    ZeroMemory m;
    int64_t shard_bytes = 0;  // this rank's shards in memory
    for (const auto& sg : sub_groups_) {
      if (sg.model_flat.defined()) {
        shard_bytes += sg.model_flat.numel() * static_cast<int64_t>(sg.model_flat.element_size());
      }
      if (!sg.model_flat.is_same(sg.master)) {
        m.master_param_bytes += static_cast<int64_t>(sg.master.element_size()) * sg.master.numel();
      }
      m.grad_bytes += sg.grad.numel() * static_cast<int64_t>(sg.grad.element_size());
    }
    for (const auto& p : params_) {
      // Frozen shards, and with own shards every shard that is in memory (numel 0 if swapped).
      if (!p.trainable || shard_store_) shard_bytes += runtime::shard_bytes(p);
    }
    m.param_bytes += shard_bytes;
    if (param_device_ != OffloadDevice::kNone) m.offloaded_param_bytes = shard_bytes;
    if (shard_store_) {
      m.nvme_param_bytes = shard_store_->swapped_bytes();
      m.swap_buffer_bytes += shard_store_->buffer_bytes();
    }
    for (const auto& p : params_) {
      // Gathered parameters: their storage is allocated right now.
      if (p.available) m.param_bytes += p.param.storage().nbytes();
      if (p.secondary.defined()) {  // Note [Secondary partition]
        m.param_bytes += p.secondary.numel() * static_cast<int64_t>(p.secondary.element_size());
      }
      if (p.param.grad().defined()) {
        m.grad_bytes += p.param.grad().numel() * static_cast<int64_t>(p.param.element_size());
      }
      m.padding_elements += p.padded_numel() - p.numel;
    }
    m.optimizer_state_bytes = optimizer_state_bytes(*optimizer_);
    for (const auto& r : reducers_) m.bucket_bytes += r->buffer_bytes();
    optimizer_states_->report(m);
    return m;
  }

  ReductionStats reduction_stats() const override {
    ReductionStats total;
    for (const auto& r : reducers_) {
      const ReductionStats s = r->stats();
      total.buckets_launched += s.buckets_launched;
      total.buckets_launched_from_hooks += s.buckets_launched_from_hooks;
      total.reductions_issued += s.reductions_issued;
      total.host_copies_in_backward += s.host_copies_in_backward;
    }
    return total;
  }
  int64_t num_buckets() const override {
    int64_t n = 0;
    for (const auto& r : reducers_) n += static_cast<int64_t>(r->num_buckets());
    return n;
  }
  bool backward_pending() const override {
    for (const auto& r : reducers_) {
      if (r->armed()) return true;
    }
    return false;
  }

  // Checkpoints: the masters are the sub-groups' fp32 flats.
  void masters_to_params() override {
    at::NoGradGuard no_grad;
    for (size_t k = 0; k < sub_groups_.size(); ++k) master_to_shards(k);
    refresh_gathered_params();
  }

  std::vector<Stage3SubGroup>& sub_groups() override { return sub_groups_; }
  std::vector<Stage3ParamInfo> param_infos() const override {
    std::vector<Stage3ParamInfo> out;
    for (size_t s = 0; s < sub_groups_.size(); ++s) {
      for (const auto& e : sub_groups_[s].entries) {
        const PartitionedParam& p = params_[e.param];
        out.push_back(Stage3ParamInfo{p.name, p.param.sizes().vec(), p.numel, p.shard_numel, s,
                                      e.offset});
      }
    }
    return out;
  }
  std::vector<std::pair<std::string, at::Tensor>> frozen_shards() override {
    std::vector<std::pair<std::string, at::Tensor>> out;
    for (auto& p : params_) {
      if (!p.trainable) out.emplace_back(p.name, shard_values(p));
    }
    return out;
  }
  std::vector<Stage3ParamInfo> frozen_param_infos() const override {
    std::vector<Stage3ParamInfo> out;
    for (const auto& p : params_) {
      if (!p.trainable) {
        out.push_back(Stage3ParamInfo{p.name, p.param.sizes().vec(), p.numel, p.shard_numel});
      }
    }
    return out;
  }
  void set_frozen_shard(size_t k, const at::Tensor& values) override {
    for (auto& p : params_) {
      if (p.trainable) continue;
      if (k-- == 0) return set_shard_values(p, values);
    }
    DS_INTERNAL_ASSERT(false, "no frozen parameter ", k);
  }
  void step_sub_group(size_t index) override {
    Stage3SubGroup& sg = sub_groups_[index];
    // A swapped master was re-pointed at a buffer: its grad is attached again for the step.
    if (sg.grad.scalar_type() == sg.master.scalar_type()) sg.master.mutable_grad() = sg.grad;
    runtime::step_sub_group(*optimizer_, sub_groups_, index);
    if (!sg.model_flat.defined()) master_to_shards(index);
  }
  void swap_in_optimizer_states() override { optimizer_states_->swap_in_all(); }
  void swap_out_optimizer_states() override { optimizer_states_->swap_out_all(); }
  void refresh_gathered_params() override {
    at::NoGradGuard no_grad;
    coordinator_->refresh_gathered();
  }
  CoordinatorStats coordinator_stats() const override { return coordinator_->stats(); }
  int world_size() const override { return world_; }
  int rank() const override { return rank_; }
  const comm::Group& partition_group(int partition) const override {
    return partition == 0 ? dp_group_ : expert_shard_group_.group;
  }
  std::string expert_group_name() const override { return expert_group_name_; }
  bool writes_checkpoint() const override {
    // Note [Node-local checkpoint storage]: under MiCS, the first replica on each node.
    return deepspeed::checkpoint::writes_shared_files(replica_group_,
                                                      config_.checkpoint.use_node_local_storage);
  }

 private:
  // MiCS: each shard group reduce-scattered its own samples' gradients (divided by the whole
  // data-parallel size); the replicas of a shard sum them once per accumulation boundary, as
  // DeepSpeed's MiCS_Optimizer.allreduce_mics_shard_grads does, so every shard group steps on
  // the gradients of all samples.
  void all_reduce_across_replicas() {
    if (replica_group_.size() <= 1) return;
    for (auto& sg : sub_groups_) {
      if (sg.grad.numel() == 0) continue;
      comm::all_reduce(sg.grad, comm::ReduceOp::kSum, /*async_op=*/false, replica_group_);
    }
  }

  // Note [Expert partitions]: AutoEP's sharded layers' weights (frozen ones too: they differ
  // between expert-parallel ranks all the same) are cut for their expert-data-parallel group,
  // and their optimizer param groups split off (DeepSpeed's engine splits them for every stage).
  void find_expert_partition(const ZeroContext& ctx) {
    const moe::ExpertGroups* groups = nullptr;
    for (const auto& [name, layer] : moe::token_choice_layers(*module_)) {
      const moe::ExpertGroups* g = layer->ep_groups();
      if (g == nullptr) continue;
      DS_INTERNAL_ASSERT(groups == nullptr || groups == g, "AutoEP layers of two ep_sizes");
      groups = g;
      for (const auto& t : layer->expert_parameters()) expert_keys_.insert(key(t));
    }
    if (groups == nullptr) return;
    expert_shard_group_ = ShardGroup(groups->expert_data_parallel);
    expert_group_name_ = groups->name;
    split_moe_param_groups(*optimizer_, ctx.expert_params);
  }

  // Every distinct parameter of the model (a tied one once, under its first name).
  void collect_params() {
    for (auto& item : module_->named_parameters(/*recurse=*/true)) {
      if (index_of_.count(key(item.value()))) continue;
      DS_CHECK(!linear::is_sharded_base_weight(item.value()), NotSupportedError,
               "ZeRO-3: '", item.key(), "' is an OptimizedLinear base weight sharded over the "
               "ranks (LoRAConfig.base_weight_sharding > 1), which ZeRO-3 would partition again "
               "as if it were whole; use base_weight_sharding 1 with ZeRO-3, or ZeRO 0-2");
      index_of_[key(item.value())] = params_.size();
      PartitionedParam p;
      p.param = item.value();
      p.name = item.key();
      p.numel = item.value().numel();
      p.partition = expert_keys_.count(key(item.value())) ? 1 : 0;
      p.world = p.partition == 0 ? world_ : expert_shard_group_.size();
      p.shard_numel = shard_numel_for(p.numel, p.world);
      // torch_autocast: a lower-precision module's shards are gathered in its dtype.
      p.gather_dtype = comm_dtype_of(comm_dtypes_, p.param, at::ScalarType::Undefined);
      params_.push_back(std::move(p));
    }
  }

  std::vector<Stage3Unit> map_units(const UnitDiscovery& found) {
    std::vector<Stage3Unit> units;
    for (const auto& f : found.units) {
      Stage3Unit u;
      u.module = f.module.get();
      u.name = f.name;
      std::set<size_t> ids;
      for (const auto& t : f.module->parameters(/*recurse=*/true)) ids.insert(index_of_.at(key(t)));
      u.params.assign(ids.begin(), ids.end());
      units.push_back(std::move(u));
    }
    return units;
  }

  // Matches DeepSpeed: parameters of at most stage3_param_persistence_threshold elements stay
  // gathered while their total stays within stage3_model_persistence_threshold. Parameters
  // registered outside every unit cannot be gathered on demand, so they persist too.
  void choose_persistent(const UnitDiscovery& found, const std::vector<Stage3Unit>& units) {
    const auto& z = config_.zero_optimization;
    std::vector<bool> in_unit(params_.size(), false);
    for (const auto& u : units) {
      for (size_t i : u.params) in_unit[i] = true;
    }
    int64_t persisted = 0;
    for (size_t i = 0; i < params_.size(); ++i) {
      PartitionedParam& p = params_[i];
      const bool small = p.numel <= z.stage3_param_persistence_threshold &&
                         persisted + p.numel <= z.stage3_model_persistence_threshold;
      if (small) persisted += p.numel;
      p.persistent = small || !in_unit[i] || found.outside_units.count(key(p.param)) > 0;
    }
  }

  std::vector<std::vector<size_t>> map_param_groups() {
    auto& groups = optimizer_->param_groups();
    std::vector<std::vector<size_t>> out(groups.size());
    std::map<size_t, size_t> group_of;
    for (size_t g = 0; g < groups.size(); ++g) {
      for (const auto& t : groups[g].params()) {
        if (!t.requires_grad()) continue;
        auto it = index_of_.find(key(t));
        DS_CHECK(it != index_of_.end(), UsageError, "optimizer param group ", g,
                 " holds a tensor that is not a parameter of the model; ZeRO-3 partitions and "
                 "steps the model's own parameters");
        const size_t i = it->second;
        auto [prev, inserted] = group_of.emplace(i, g);
        if (!inserted) {
          DS_CHECK(prev->second == g, ConfigError, "parameter '", params_[i].name,
                   "' appears in more than one optimizer param group");
          continue;  // a tied parameter listed under two names
        }
        DS_CHECK(t.scalar_type() == model_dtype_, UsageError, "parameter '", params_[i].name,
                 "' is ", t.scalar_type(), " but the engine trains in ", model_dtype_,
                 " (fp16.enabled / bf16.enabled); keep every trainable parameter in that dtype");
        params_[i].trainable = true;
        out[g].push_back(i);
      }
    }
    std::vector<std::string> orphans;
    for (const auto& p : params_) {
      if (p.param.requires_grad() && !p.trainable) orphans.push_back(p.name);
    }
    if (!orphans.empty()) {
      std::ostringstream os;
      os << orphans.size() << " trainable parameter(s) are in no optimizer param group and will "
         << "not be updated (first: '" << orphans.front() << "')";
      log::warn_rank0(os.str());
    }
    return out;
  }

  // Each rank's shard: zero::Init's if it cut one, else rank 0's values (broadcast, as the
  // engine does for the other stages) sliced here. Then persistent parameters end gathered and
  // the others released.
  void fill_shards() {
    for (auto& p : params_) {
      if (!p.trainable) p.shard = at::zeros({p.shard_numel}, shard_options_.dtype(p.param.scalar_type()));
      auto pre = take_pre_partitioned(p.param);
      DS_CHECK(!pre || p.partition == 0, NotSupportedError, "parameter '", p.name, "' is an "
               "AutoEP expert weight that zero::Init partitioned over the data-parallel group; "
               "expert_parallel with a model built under zero::Init is not supported (build it "
               "outside zero::Init: the engine cuts each rank's experts for their "
               "expert-data-parallel group)");
      // Own shards (offload_param "nvme") adopt zero::Init's shard as it is: no copy.
      if (!p.shard.defined()) {
        const bool adopt = pre && pre->world == world_ && pre->shard.scalar_type() == model_dtype_ &&
                           pre->shard.device() == shard_options_.device() &&
                           pre->shard.is_contiguous() && pre->shard.numel() == p.shard_numel;
        if (adopt) {
          p.shard = pre->shard;
          p.available = false;
          continue;
        }
        p.shard = at::zeros({p.shard_numel}, shard_options_.dtype(model_dtype_));
      }
      if (pre) {
        DS_CHECK(pre->world == world_, UsageError, "parameter '", p.name,
                 "' was partitioned by zero::Init for ", pre->world, " ranks; this job has ",
                 world_);
        DS_CHECK(pre->shard.scalar_type() == p.shard.scalar_type(), UsageError, "parameter '",
                 p.name, "' was partitioned by zero::Init as ", pre->shard.scalar_type(),
                 " but the engine trains in ", p.shard.scalar_type(),
                 "; give zero::Init the engine's config");
        p.shard.copy_(pre->shard);
        p.available = false;
        continue;
      }
      p.available = true;
      if (p.numel == 0) continue;
      ensure_own_storage(p.param);
      at::Tensor full = storage_as_flat(p.param, p.numel);
      // Every data-parallel rank starts from its group's first rank's values (under MiCS the
      // replicas too, so the whole data-parallel group).
      // AutoEP's experts from their expert-data-parallel group's first rank.
      const comm::Group& from = p.partition == 0 ? broadcast_group_ : expert_shard_group_.group;
      if (from.size() > 1) comm::broadcast(full, from.global_rank(0), false, from);
      const int64_t begin = std::min<int64_t>(p.numel, partition_rank(p) * p.shard_numel);
      const int64_t len = std::min<int64_t>(p.shard_numel, p.numel - begin);
      if (len > 0) p.shard.narrow(0, 0, len).copy_(full.narrow(0, begin, len));
    }
    // Note [Quantized frozen shards]: DeepSpeed's rule is requires_grad, whatever the groups.
    if (config_.zero_optimization.zero_quantized_nontrainable_weights) {
      for (auto& p : params_) {
        if (p.param.requires_grad() || p.numel == 0) continue;
        quantize_shard(p);
        if (p.available) release(p);  // the exact values go: persistent ones gather again
      }
    }
    std::vector<PartitionedParam*> persistent;
    for (auto& p : params_) {
      if (p.persistent && !p.available) persistent.push_back(&p);
      if (!p.persistent && p.available) release(p);
    }
    start_partitioned_gathers(persistent, {gather_group_, expert_shard_group_}, /*async=*/false,
                              /*use_all_reduce=*/false);
  }

  void start_coordinator(std::vector<Stage3Unit> units, const UnitDiscovery& found) {
    const auto& z = config_.zero_optimization;
    // A unit whose parameters all persist has nothing to gather: it runs unintercepted.
    std::vector<Stage3Unit> kept;
    std::vector<std::shared_ptr<torch::nn::SequentialImpl>> parents;
    for (size_t k = 0; k < units.size(); ++k) {
      Stage3Unit& u = units[k];
      u.numel = 0;
      for (size_t i : u.params) {
        if (!params_[i].persistent) u.numel += params_[i].padded_numel();
      }
      if (u.numel == 0) continue;
      kept.push_back(std::move(u));
      parents.push_back(found.units[k].sequential);
    }
    CoordinatorOptions o;
    o.prefetch_bucket_numel = z.stage3_prefetch_bucket_size;
    // Matches DeepSpeed: stage3_allgather_sequential forces a prefetch bucket of 1.
    if (z.stage3_allgather_sequential) o.prefetch_bucket_numel = std::min<int64_t>(o.prefetch_bucket_numel, 1);
    o.max_live_numel = z.stage3_max_live_parameters;
    o.max_reuse_distance_numel = z.stage3_max_reuse_distance;
    o.use_all_reduce_for_fetch = z.stage3_use_all_reduce_for_fetch_params;
    o.group = gather_group_;
    o.expert_group = expert_shard_group_;
    o.quantize_weights = z.zero_quantized_weights;
    coordinator_ = std::make_shared<ParamCoordinator>(&params_, kept, o);
    register_coordinator(coordinator_);
    for (size_t u = 0; u < kept.size(); ++u) {
      register_unit(kept[u].module, coordinator_, u);
      if (parents[u]) interception_.intercept(parents[u], kept[u].module);
    }
  }

  // offload_param "nvme" is for models that need not fit in memory whole, so the engine's end
  // does not gather them: as DeepSpeed's partitioned parameters (param.data is empty, the
  // values are in ds_tensor), they are left with no elements; zero::GatheredParameters before
  // the engine goes, save_16bit_model or a checkpoint get the values.
  void leave_partitioned() {
    at::NoGradGuard no_grad;
    bool emptied = false;
    for (auto& p : params_) {
      if (p.available && p.persistent) continue;  // gathered and small: stays usable
      at::Tensor handle = p.param;
      handle.set_data(at::empty({0}, p.param.options()));
      emptied = true;
    }
    if (emptied) {
      log::warn_rank0("ZeRO-3 with offload_param \"nvme\": the engine leaves the model's "
                      "partitioned parameters empty (gather them with zero::GatheredParameters "
                      "before the engine goes, or use save_16bit_model / save_checkpoint)");
    }
  }

  // The model-dtype shards from the master of sub-group k, and back. With a flat they are
  // one copy (none when the master is the flat); with own shards, one per parameter, through
  // the shard store for swapped ones.
  void master_to_shards(size_t k) {
    Stage3SubGroup& sg = sub_groups_[k];
    if (sg.model_flat.defined()) {
      if (!sg.model_flat.is_same(sg.master)) sg.model_flat.copy_(sg.master);
      return;
    }
    for (const auto& e : sg.entries) {
      // A copy even where the master has the model's dtype: the shard store may write it
      // behind, after the master's buffer went back to the swapper.
      at::Tensor values = sg.master.narrow(0, e.offset, e.numel)
                              .to(model_dtype_, /*non_blocking=*/false, /*copy=*/true);
      if (shard_store_ && shard_store_->registered(e.param)) {
        shard_store_->write(e.param, values);
      } else {
        params_[e.param].shard.copy_(values);
      }
    }
  }
  void shards_to_master(size_t k) {
    Stage3SubGroup& sg = sub_groups_[k];
    if (sg.model_flat.defined()) {
      if (!sg.model_flat.is_same(sg.master)) sg.master.copy_(sg.model_flat);
      return;
    }
    for (const auto& e : sg.entries) {
      const bool swapped = shard_store_ && shard_store_->swapped(e.param);
      if (swapped) shard_store_->swap_in({e.param});
      sg.master.narrow(0, e.offset, e.numel).copy_(params_[e.param].shard);
      if (swapped) shard_store_->release({e.param});
    }
  }

  // Note [NVMe shards]: with offload_param "nvme" every trainable parameter that is not
  // persistent has a shard of its own (build_sub_groups' own_shards), registered here with the
  // shard store, which writes it to a swap file and frees it. The coordinator reads shards in
  // for the all-gathers (read-ahead along the trace) and drops them after; the step writes the
  // updated shards through. Persistent and frozen parameters keep their shards in memory.
  void start_shard_store() {
    const auto& o = *config_.zero_optimization.offload_param;
    swap::ShardSwapperOptions so;
    so.nvme_path = o.nvme_path;
    so.rank = global_rank();  // swap files are per process: model-parallel peers share dp ranks
    so.dtype = model_dtype_;
    so.buffer_count = o.buffer_count;
    so.buffer_size = o.buffer_size;
    so.max_in_cpu = o.max_in_cpu;
    so.aio = aio::AioOptions::from_config(config_.aio, config_.source);
    shard_store_ = std::make_unique<NvmeShardStore>(&params_, so);
    for (const auto& sg : sub_groups_) {
      for (const auto& e : sg.entries) {
        if (!params_[e.param].persistent) shard_store_->add(e.param);
      }
    }
    coordinator_->set_shard_store(shard_store_.get());
  }

  // A reducer per partition (Note [Expert partitions]): the experts' over their
  // expert-data-parallel group, still divided by the data-parallel size.
  void start_reducers() {
    for (int partition : {0, 1}) {
      std::vector<size_t> trainable;
      std::vector<at::Tensor> grad_shards;
      for (auto& sg : sub_groups_) {
        for (const auto& e : sg.entries) {
          if (params_[e.param].partition != partition) continue;
          trainable.push_back(e.param);
          grad_shards.push_back(sg.grad.narrow(0, e.offset, e.numel));
        }
      }
      if (trainable.empty()) continue;
      reducers_.push_back(
          start_reducer(std::move(trainable), std::move(grad_shards), partition_group(partition)));
    }
  }

  std::unique_ptr<Stage3GradReducer> start_reducer(std::vector<size_t> trainable,
                                                   std::vector<at::Tensor> grad_shards,
                                                   const comm::Group& group) {
    const auto& z = config_.zero_optimization;
    Stage3ReducerOptions ro;
    ro.bucket_numel = z.reduce_bucket_numel();
    ro.overlap_comm = z.overlap_comm_enabled();
    ro.contiguous_gradients = z.contiguous_gradients;
    ro.reduce_scatter = z.reduce_scatter;
    ro.average = config_.gradient_allreduce_op == "mean";
    ro.ignore_unused_parameters = z.ignore_unused_parameters;
    ro.bucket_dtype = communication_dtype_;
    ro.comm_dtypes = comm_dtypes_;
    ro.group = group;
    ro.average_divisor = average_divisor_;
    ro.quantized_reduction = qgz_groups_;
    ro.loco = z.zeropp_loco_param;
    const bool offloads = optimizer_states_->offloads() || param_device_ != OffloadDevice::kNone;
    ro.host_shards = grad_shards[0].device() != params_[trainable[0]].param.device() ||
                     (offloads && offload_host_path_on_cpu());
    // On CPU, Gloo has no reduce-scatter: comm::reduce_scatter would all-reduce a copy of each
    // bucket and keep this rank's chunk. DeepSpeed's all-reduce path makes the same sums over
    // the same bytes in the bucket itself: no copy, no receive buffers (the memory formula
    // counts none either). comm's emulation cannot sum bf16 at all (all_reduce widens it).
    // DS_TEST_STAGE3_REDUCE_SCATTER_ON_CPU=1 keeps the reduce-scatter path of a GPU, to test it.
    bool bf16_buckets = ro.bucket_dtype == at::kBFloat16;
    for (const auto& [param, dtype] : ro.comm_dtypes) bf16_buckets |= dtype == at::kBFloat16;
    if (params_[trainable[0]].param.is_cpu() &&
        (bf16_buckets || !reduce_scatter_on_cpu_for_tests())) {
      ro.reduce_scatter = false;
    }
    return std::make_unique<Stage3GradReducer>(&params_, std::move(trainable),
                                               std::move(grad_shards), ro);
  }

  const DeepSpeedConfig& config_;
  torch::optim::Optimizer* optimizer_;
  std::unique_ptr<Stage3Muon> muon_;  // Muon's sub-groups step orthogonalized gradients
  double step_grad_scale_ = 1.0;  // scale_gradients' coefficient, for the optimizer's step
  std::shared_ptr<torch::nn::Module> module_;
  int global_rank() const { return dp_group_.global_rank(rank_); }

  comm::Group broadcast_group_;  // the data-parallel group: every rank starts from its first's
  comm::Group dp_group_;        // the partition group: data-parallel, or MiCS' shard group
  comm::Group replica_group_;   // MiCS: the ranks holding this rank's shards; else this rank
  ShardGroup gather_group_;     // dp_group_, MiCS' hierarchy and hpZ's secondary group
  // Note [Expert partitions]: AutoEP's expert-data-parallel group, and its layers' weights.
  ShardGroup expert_shard_group_;
  std::unordered_set<const c10::TensorImpl*> expert_keys_;
  std::string expert_group_name_;
  int64_t partition_rank(const PartitionedParam& p) const {
    return p.partition == 0 ? rank_ : expert_shard_group_.rank();
  }
  std::optional<NodeGroups> qgz_groups_;  // ZeRO++ qgZ (Note [Quantized reduction])
  int world_;  // partition-group size and rank
  int rank_;
  int average_divisor_;  // what a "mean" reduction divides by (ZeroContext::average_divisor)
  // offload_param: the shards in host memory ("cpu": where a CPU-only build keeps them
  // anyway) or in swap files read in for each all-gather ("nvme": shard_store_, Note [NVMe
  // shards]).
  const OffloadDevice param_device_ = config_.zero_optimization.param_offload();
  at::TensorOptions shard_options_;  // where the model-dtype shards live (host with offload_param)
  at::ScalarType model_dtype_;
  at::ScalarType grad_accum_dtype_;
  at::ScalarType communication_dtype_;
  CommDtypes comm_dtypes_;  // torch_autocast's lower-precision parameters
  std::vector<PartitionedParam> params_;
  std::unordered_map<const c10::TensorImpl*, size_t> index_of_;
  std::vector<Stage3SubGroup> sub_groups_;
  std::shared_ptr<ParamCoordinator> coordinator_;
  SequentialInterception interception_;
  // One per partition that has trainable parameters (Note [Expert partitions]).
  std::vector<std::unique_ptr<Stage3GradReducer>> reducers_;
  // Masters and optimizer state by offload_optimizer.device; declared late: destroyed early.
  std::unique_ptr<OptimizerStateStore> optimizer_states_;
  std::unique_ptr<NvmeShardStore> shard_store_;  // offload_param "nvme" only
};

}  // namespace

// Matches DeepSpeed's _validate_zero3_moe_compatibility: ZeRO-3 takes AutoEP's layers
// (Note [Expert partitions]), not deepspeed::moe's.
void check_expert_partition(const ZeroContext& context) {
  if (context.expert_params.empty()) return;
  const std::string& source = context.config->source;
  DS_CHECK(moe::moe_layers(*context.module).empty(), NotSupportedError,
           "Native DeepSpeed MoE is not supported with ZeRO Stage 3 (zero_optimization.stage 3 "
           "with deepspeed::moe::MoE layers). Use AutoEP (expert_parallel) or choose ZeRO stage "
           "1/2.");
  const auto& z = context.config->zero_optimization;
  DS_CHECK(!context.mics, NotSupportedError, source, ": expert_parallel (AutoEP) with "
           "zero_optimization.mics_shard_size is not supported");
  DS_CHECK(!context.hpz_group, NotSupportedError, source, ": AutoEP with ZeRO Stage 3 does not "
           "support hpZeRO secondary tensor groups (zero_optimization.zero_hpz_partition_size ",
           z.zero_hpz_partition_size, ")");
  DS_CHECK(!z.zero_quantized_gradients, NotSupportedError, source, ": AutoEP with ZeRO Stage 3 "
           "does not support zero_optimization.zero_quantized_gradients");
  DS_CHECK(dynamic_cast<optim::Muon*>(context.optimizer) == nullptr, NotSupportedError, source,
           ": the Muon optimizer with expert_parallel (AutoEP) at ZeRO stage 3 is not supported "
           "yet (its Newton-Schulz gathers each matrix over the data-parallel group)");
}

std::unique_ptr<ZeroOptimizer> make_stage3(const ZeroContext& context) {
  check_expert_partition(context);
  return std::make_unique<Stage3>(context);
}

}  // namespace deepspeed::runtime
