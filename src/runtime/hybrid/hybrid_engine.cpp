// The engine's hybrid-engine members (hybrid_engine.enabled): DeepSpeed's DeepSpeedHybridEngine
// is a subclass of its engine; here the engine itself takes the part when the section asks.
#include <ATen/ATen.h>

#include "deepspeed/comm.h"
#include "deepspeed/engine.h"
#include "runtime/hybrid/hybrid_engine_state.h"
#include "util/check.h"
#include "util/logging.h"
#include "util/torch_compat.h"

namespace deepspeed {

void Engine::start_hybrid_engine() {
  hybrid_ = std::make_unique<runtime::HybridEngineState>(
      config_.hybrid_engine, config_.zero_optimization.stage == 3, comm::get_world_size());
  // Matches DeepSpeed: the accelerator's generator of rank 0 on every rank.
  if (comm::get_world_size() > 1) {
    at::Generator gen = device_.is_cuda() ? compat::default_cuda_generator(device_.index())
                                          : at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    at::Tensor state = gen.get_state();
    at::Tensor on_device = state.to(device_);
    comm::broadcast(on_device, 0);
    gen.set_state(on_device.cpu());
  }
  log::info_rank0(std::string("hybrid engine: generate_with() gathers ") +
                  (config_.zero_optimization.stage == 3 && config_.hybrid_engine.pin_parameters
                       ? "every ZeRO-3 parameter once per generation"
                       : "nothing beyond what the forwards gather") +
                  "; eval() prints the latency breakdown");
}

void Engine::train(bool on) {
  module_->train(on);
  if (hybrid_) hybrid_->on_train(on);
}

void Engine::eval() {
  if (hybrid_) {
    if (auto line = hybrid_->on_eval()) log::info_rank0(*line);
  }
  module_->eval();
}

Engine::GenerationScope::GenerationScope(Engine& engine, int64_t batch_size) : engine_(engine) {
  DS_CHECK(engine.hybrid_ != nullptr, UsageError,
           "engine.generate_with(): generation through the engine needs hybrid_engine.enabled "
           "in the config (DeepSpeed's hybrid engine); call the model directly otherwise");
  engine.hybrid_->generation_begin(*engine.module_, batch_size);
}

Engine::GenerationScope::~GenerationScope() { engine_.hybrid_->generation_end(); }

}  // namespace deepspeed
