// AutotuningProbe: see autotuning_probe.h. Files match DeepSpeed's names and keys
// (autotuning_metric.json: latency, throughput, FLOPS_per_gpu; autotuning_model_info.json:
// num_params, trainable_num_params, activation_mem_per_gpu) plus the memory figures the tuner's
// prediction uses.
#include "runtime/autotuning_probe.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include <ATen/ATen.h>

#include "deepspeed/comm.h"
#include "runtime/memory_budget.h"
#include "util/logging.h"

namespace deepspeed::runtime {
namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace

AutotuningProbe::AutotuningProbe(const DeepSpeedConfig& config, AutotuningModelFacts facts, int rank)
    : config_(AutotuningConfig::of(config)), facts_(facts), zero_stage_(config.zero_optimization.stage),
      micro_batch_(config.batch.train_micro_batch_size_per_gpu),
      gradient_accumulation_steps_(config.batch.gradient_accumulation_steps),
      train_batch_size_(config.batch.train_batch_size), rank_(rank) {
  sample_memory();
}

// The larger of the data memory in use now and the resident peak since the base, plus what is
// mapped but not resident: the samples alone miss what happens between them (the flattening at
// initialization, backward's peak, a step's all-gather buffer).
void AutotuningProbe::sample_memory() {
  peak_in_use_ = std::max({peak_in_use_, memory_in_use_since_base(), peak_mapped_since_base()});
}

void AutotuningProbe::forward_begin() {
  sample_memory();
  forward_start_live_ = live_allocated_bytes();
}

void AutotuningProbe::forward_end() {
  sample_memory();
  const int64_t now = live_allocated_bytes();
  // The activations autograd keeps for backward: the growth over the second forward (the first
  // also maps buffers that stay, e.g. the allocator's arenas of new threads).
  if (++forwards_ <= 2) activation_bytes_ = std::max<int64_t>(0, now - forward_start_live_);
}

void AutotuningProbe::after_step(int64_t completed_steps, const std::map<std::string, double>& timers_ms,
                                 int64_t model_state_device_bytes) {
  sample_memory();
  // The peak over the whole job so far, over all ranks (the tuner compares it with the budget).
  auto peak_all = [&] {
    int64_t peak = peak_in_use_;
    if (comm::is_initialized() && comm::get_world_size() > 1) {
      at::Tensor t = at::full({1}, peak, at::kLong);
      comm::all_reduce(t, comm::ReduceOp::kMax);
      peak = t.item<int64_t>();
    }
    return peak;
  };
  if (config_.profile_model_info()) {
    if (completed_steps < 2) return;
    const int64_t peak = peak_all();
    const int64_t per_sample = activation_bytes_ / std::max<int64_t>(1, micro_batch_);
    nlohmann::json info = {{"num_params", facts_.num_params * facts_.mp_world_size},
                           {"trainable_num_params", facts_.trainable_num_params * facts_.mp_world_size},
                           {"activation_mem_per_gpu", activation_bytes_},
                           {"activation_mem_per_sample", per_sample},
                           {"peak_memory_bytes", peak},
                           {"model_state_device_bytes", model_state_device_bytes},
                           {"largest_param_numel", facts_.largest_param_numel},
                           {"param_bytes", facts_.param_bytes},
                           {"zero_stage", zero_stage_},
                           {"train_micro_batch_size_per_gpu", micro_batch_},
                           {"dp_world_size", facts_.dp_world_size},
                           {"device", facts_.on_cpu ? "cpu" : "cuda"},
                           {"rank", 0}};
    finish(info, config_.model_info_file());
  }
  // Matches DeepSpeed: steps with global_steps in [start_profile_step, end_profile_step] before
  // the step are measured; the process ends after the last of them.
  const int64_t step_index = completed_steps - 1;
  if (step_index >= config_.start_profile_step && step_index <= config_.end_profile_step) {
    double latency = 0;
    for (const char* t : {"fwd", "bwd", "step"}) {
      auto it = timers_ms.find(t);
      if (it != timers_ms.end()) latency += it->second;
    }
    step_latencies_ms_.push_back(latency);
  }
  if (step_index < config_.end_profile_step) return;
  const int64_t peak = peak_all();
  // The median step: robust to one slow step on a shared machine (DeepSpeed: a trimmed mean).
  const double latency_ms = step_latencies_ms_.empty() ? 0.0 : median(step_latencies_ms_);
  const double flops_per_gpu =
      latency_ms > 0 ? 3.0 * static_cast<double>(forward_flops_) * gradient_accumulation_steps_ / (latency_ms / 1e3) : 0;
  nlohmann::json metric = {{"latency", latency_ms},
                           {"throughput", latency_ms > 0 ? train_batch_size_ * 1e3 / latency_ms : 0.0},
                           {"FLOPS_per_gpu", flops_per_gpu},
                           {"flops", flops_per_gpu},
                           {"step_latencies_ms", step_latencies_ms_},
                           {"peak_memory_bytes", peak},
                           {"model_state_device_bytes", model_state_device_bytes},
                           {"train_batch_size", train_batch_size_},
                           {"train_micro_batch_size_per_gpu", micro_batch_},
                           {"gradient_accumulation_steps", gradient_accumulation_steps_},
                           {"zero_stage", zero_stage_}};
  finish(metric, config_.metric_file());
}

void AutotuningProbe::finish(const nlohmann::json& record, const std::string& path) {
  if (rank_ == 0) {
    const std::string tmp = path + ".tmp";
    {
      std::ofstream out(tmp);
      out << record.dump() << "\n";
    }
    std::rename(tmp.c_str(), path.c_str());  // the tuner never reads half a file
    log::info_rank0("autotuning: wrote " + path + "; exiting (Note [Autotuning exit])");
  }
  if (comm::is_initialized() && comm::get_world_size() > 1) comm::barrier();
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(0);
}

}  // namespace deepspeed::runtime
