// The engine's side of autotuning (DeepSpeed's autotuning hooks in engine.py): with
// `autotuning.enabled` the engine measures the optimizer steps start_profile_step..
// end_profile_step, writes the metric file and ends the process; with `model_info.profile` it
// measures the model (parameters, activation memory per sample, peak memory of the steps) and
// writes the model-info file after the second optimizer step instead. The tuner (tools/deepspeed/autotuner*)
// reads both files.
//
// Note [Autotuning exit]: like DeepSpeed, the process exits (status 0) once its files are
// written: an experiment is a user's whole training script, which cannot know that it should
// stop. Every rank waits at a barrier first, so no rank is left in a collective; the exit skips
// static destructors (std::_Exit) because Gloo's threads are still running.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "deepspeed/autotuning_config.h"
#include "deepspeed/config.h"

namespace deepspeed::runtime {

struct AutotuningModelFacts {
  int64_t num_params = 0;            // every parameter, each tensor once
  int64_t trainable_num_params = 0;
  int64_t largest_param_numel = 0;
  int64_t param_bytes = 4;           // bytes per element of the model's parameters
  int64_t dp_world_size = 1;
  int64_t mp_world_size = 1;
  bool on_cpu = true;                // the model trains on CPU (the memory formula differs)
};

// Held by the engine of an experiment process (autotuning.enabled); absent otherwise.
class AutotuningProbe {
 public:
  AutotuningProbe(const DeepSpeedConfig& config, AutotuningModelFacts facts, int rank);

  void forward_begin();
  void forward_end();
  /// After backward (and its gradient reduction): the peak of a step is often here.
  void backward_end() { sample_memory(); }
  /// `flops`: the flops profiler's forward flops of the profiled step (0 when it did not run).
  void set_forward_flops(int64_t flops) { forward_flops_ = flops; }
  /// After each optimizer step: `completed_steps` = global_steps after it, `timers_ms` the step's
  /// fwd/bwd/step global timers, `model_state_device_bytes` the ledger's device_bytes().
  /// May end the process (Note [Autotuning exit]).
  void after_step(int64_t completed_steps, const std::map<std::string, double>& timers_ms,
                  int64_t model_state_device_bytes);

 private:
  void sample_memory();
  [[noreturn]] void finish(const nlohmann::json& record, const std::string& path);

  AutotuningConfig config_;
  AutotuningModelFacts facts_;
  int64_t zero_stage_;
  int64_t micro_batch_;
  int64_t gradient_accumulation_steps_;
  int64_t train_batch_size_;
  int rank_;
  int64_t peak_in_use_ = 0;
  int64_t forward_start_live_ = 0;
  int64_t activation_bytes_ = -1;  // the second forward's growth (the first maps one-time buffers)
  int64_t forwards_ = 0;
  int64_t forward_flops_ = 0;
  std::vector<double> step_latencies_ms_;
};

}  // namespace deepspeed::runtime
