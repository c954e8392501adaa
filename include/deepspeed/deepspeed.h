// deepspeed-cpp: the umbrella header. A training loop needs only this:
//
//   auto [engine, optimizer, lr_scheduler] = deepspeed::initialize(model, "ds_config.json");
//   auto loss = engine->forward(batch);
//   engine->backward(loss);
//   engine->step();
#pragma once

#include <memory>
#include <string>

#include "deepspeed/comm.h"
#include "deepspeed/config.h"
#include "deepspeed/engine.h"
#include "deepspeed/errors.h"
#include "deepspeed/lr_schedules.h"
#include "deepspeed/version.h"

namespace deepspeed {

/// What initialize() returns (DeepSpeed returns engine, optimizer, dataloader, lr_scheduler;
/// the C++ API has no dataloader argument). The raw pointers are owned by the engine.
template <typename Module>
struct Initialized {
  std::shared_ptr<ModuleEngine<Module>> engine;
  torch::optim::Optimizer* optimizer;
  optim::LRScheduler* lr_scheduler;
};

/// Parses `config` (a ds_config.json path, JSON text, or base64 JSON) for the data-parallel
/// world size of the current job. Initializes deepspeed::comm from the environment if needed.
DeepSpeedConfig load_config(const std::string& config);
DeepSpeedConfig load_config(const json& config);

/// Builds the engine: initializes distributed from the environment (RANK, WORLD_SIZE, ...),
/// parses and checks the config, seeds torch when `seed` is set, broadcasts rank 0's
/// parameters, and builds the optimizer and LR scheduler from the config unless given.
/// Throws ConfigError / NotSupportedError naming the key.
template <typename Module>
Initialized<Module> initialize(std::shared_ptr<Module> model, const DeepSpeedConfig& config,
                               std::unique_ptr<torch::optim::Optimizer> optimizer = nullptr,
                               LRSchedulerFactory lr_scheduler = nullptr) {
  if (!model) throw UsageError("deepspeed::initialize requires a model");
  auto engine = std::make_shared<ModuleEngine<Module>>(model, config, std::move(optimizer),
                                                       std::move(lr_scheduler));
  return {engine, engine->optimizer(), engine->lr_scheduler()};
}

template <typename Module>
Initialized<Module> initialize(std::shared_ptr<Module> model, const std::string& config,
                               std::unique_ptr<torch::optim::Optimizer> optimizer = nullptr,
                               LRSchedulerFactory lr_scheduler = nullptr) {
  return initialize(std::move(model), load_config(config), std::move(optimizer),
                    std::move(lr_scheduler));
}

template <typename Module>
Initialized<Module> initialize(std::shared_ptr<Module> model, const json& config,
                               std::unique_ptr<torch::optim::Optimizer> optimizer = nullptr,
                               LRSchedulerFactory lr_scheduler = nullptr) {
  return initialize(std::move(model), load_config(config), std::move(optimizer),
                    std::move(lr_scheduler));
}

template <typename Module>
Initialized<Module> initialize(std::shared_ptr<Module> model, const char* config,
                               std::unique_ptr<torch::optim::Optimizer> optimizer = nullptr,
                               LRSchedulerFactory lr_scheduler = nullptr) {
  return initialize(std::move(model), std::string(config), std::move(optimizer),
                    std::move(lr_scheduler));
}

}  // namespace deepspeed
