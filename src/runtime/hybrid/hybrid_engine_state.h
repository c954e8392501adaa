// The hybrid engine's part of Engine (hybrid_engine.enabled): the gather that spans a
// generation, and the latency bookkeeping behind DeepSpeed's line
// "|E2E latency=...|Gather latency=...|Generate time=...|Training time=...|Others=...".
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <torch/nn/module.h>

#include "deepspeed/config.h"
#include "deepspeed/zero3.h"

namespace deepspeed::runtime {

class HybridEngineState {
 public:
  using Clock = std::chrono::steady_clock;

  /// `zero3`: the engine partitions parameters (ZeRO stage 3).
  HybridEngineState(const HybridEngineConfig& config, bool zero3, int world_size);

  /// A generation starts: `batch_size` samples on this rank (0: unknown); with ZeRO-3 and
  /// pin_parameters every partitioned parameter of `module` is gathered until generation_end.
  void generation_begin(torch::nn::Module& module, int64_t batch_size);
  void generation_end();

  /// engine.eval(): from the second call on, the line for the period since the last eval()
  /// (rank 0 prints it; returned for tests). engine.train(true) and step() time the training.
  std::optional<std::string> on_eval();
  void on_train(bool mode);
  void on_step();

  double gather_latency_s() const { return gather_latency_; }
  double generate_latency_s() const { return generate_latency_; }
  double training_latency_s() const { return training_latency_; }

 private:
  static double seconds_since(Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  }

  HybridEngineConfig config_;
  bool zero3_;
  int world_size_;
  std::unique_ptr<zero::GatheredParameters> gathered_;
  Clock::time_point generation_start_;
  std::optional<Clock::time_point> period_start_;    // DeepSpeed's _t_start
  std::optional<Clock::time_point> training_start_;  // DeepSpeed's _training_start_time
  std::optional<int64_t> total_batch_size_;  // samples over all ranks, from the first generation
  double total_latency_ = 0;
  int64_t iters_ = 0;
  double gather_latency_ = 0, generate_latency_ = 0, training_latency_ = 0;
};

}  // namespace deepspeed::runtime
