// DeepSpeed's DeepSpeedHybridEngine bookkeeping (runtime/hybrid_engine.py), without its inference
// kernels: the same periods, the same line.
#include "runtime/hybrid/hybrid_engine_state.h"

#include <cstdio>

namespace deepspeed::runtime {

HybridEngineState::HybridEngineState(const HybridEngineConfig& config, bool zero3,
                                     int world_size)
    : config_(config), zero3_(zero3), world_size_(world_size) {}

void HybridEngineState::generation_begin(torch::nn::Module& module, int64_t batch_size) {
  if (!total_batch_size_ && batch_size > 0) total_batch_size_ = batch_size * world_size_;
  generation_start_ = Clock::now();
  if (zero3_ && config_.pin_parameters) {
    // DeepSpeed gathers every layer once for the whole generation; without pin_parameters each
    // layer is gathered around its forward, as training does.
    gathered_ = std::make_unique<zero::GatheredParameters>(module);
    gather_latency_ = seconds_since(generation_start_);
  }
}

void HybridEngineState::generation_end() {
  gathered_.reset();
  generate_latency_ = seconds_since(generation_start_) - gather_latency_;
}

std::optional<std::string> HybridEngineState::on_eval() {
  std::optional<std::string> line;
  if (period_start_) {
    const double latency = seconds_since(*period_start_);
    total_latency_ += latency;
    ++iters_;
    const double others = latency - (generate_latency_ + training_latency_);
    auto pct = [&](double part) { return latency > 0 ? part / latency * 100.0 : 0.0; };
    char buf[512];
    std::snprintf(buf, sizeof(buf),
                  "|E2E latency=%.2fs |Gather latency=%.2fs (%.2f%%) |Generate time=%.2fs "
                  "(%.2f%%) |Training time=%.2fs (%.2f%%) |Others=%.2f (%.2f%%)",
                  latency, gather_latency_, pct(gather_latency_), generate_latency_,
                  pct(generate_latency_), training_latency_, pct(training_latency_), others,
                  pct(others));
    line = buf;
    if (total_batch_size_ && latency > 0) {
      const double batch = static_cast<double>(*total_batch_size_);
      std::snprintf(buf, sizeof(buf), "|CurSamplesPerSec=%.2f |AvgSamplesPerSec=%.2f",
                    batch / latency, batch / (total_latency_ / static_cast<double>(iters_)));
      *line += buf;
    }
    period_start_ = Clock::now();
  }
  training_latency_ = 0;
  if (!period_start_) period_start_ = Clock::now();
  return line;
}

void HybridEngineState::on_train(bool mode) {
  if (mode) training_start_ = Clock::now();
}

void HybridEngineState::on_step() {
  if (!training_start_) return;
  training_latency_ += seconds_since(*training_start_);
  training_start_ = Clock::now();
}

}  // namespace deepspeed::runtime
