// deepspeed-cpp: the umbrella header. A training loop needs only this:
//
//   auto [engine, optimizer, lr_scheduler] = deepspeed::initialize(model, "ds_config.json");
//   auto loss = engine->forward(batch);
//   engine->backward(loss);
//   engine->step();
#pragma once

#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "deepspeed/checkpointing.h"
#include "deepspeed/comm.h"
#include "deepspeed/compression.h"
#include "deepspeed/config.h"
#include "deepspeed/curriculum_scheduler.h"
#include "deepspeed/data_sampling.h"
#include "deepspeed/engine.h"
#include "deepspeed/errors.h"
#include "deepspeed/linear.h"
#include "deepspeed/lr_schedules.h"
#include "deepspeed/mpu.h"
#include "deepspeed/muon.h"
#include "deepspeed/param_group.h"
#include "deepspeed/progressive_layer_drop.h"
#include "deepspeed/random_ltd.h"
#include "deepspeed/sparse_attention.h"
#include "deepspeed/variable_batch.h"
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
/// size of the current job: the world size, or the mpu's data-parallel world size (DeepSpeed's
/// train_batch_size = micro * accumulation * data-parallel size). Initializes deepspeed::comm
/// from the environment if needed.
DeepSpeedConfig load_config(const std::string& config, const Mpu* mpu = nullptr);
DeepSpeedConfig load_config(const json& config, const Mpu* mpu = nullptr);

/// Builds the engine: initializes distributed from the environment (RANK, WORLD_SIZE, ...),
/// parses and checks the config, seeds torch when `seed` is set, broadcasts the parameters of
/// each data-parallel group's first rank, and builds the optimizer and LR scheduler from the
/// config unless given. `mpu` (DeepSpeed's mpu, as Megatron passes it): the data- and
/// model-parallel groups; without one the job is data-parallel over the world.
/// Throws ConfigError / NotSupportedError naming the key.
template <typename Module>
Initialized<Module> initialize(std::shared_ptr<Module> model, const DeepSpeedConfig& config,
                               std::unique_ptr<torch::optim::Optimizer> optimizer = nullptr,
                               LRSchedulerFactory lr_scheduler = nullptr,
                               std::shared_ptr<Mpu> mpu = nullptr) {
  if (!model) throw UsageError("deepspeed::initialize requires a model");
  auto engine = std::make_shared<ModuleEngine<Module>>(
      model, config, std::move(optimizer), std::move(lr_scheduler), std::vector<ParamGroup>{},
      std::move(mpu));
  return {engine, engine->optimizer(), engine->lr_scheduler()};
}

template <typename Module>
Initialized<Module> initialize(std::shared_ptr<Module> model, const std::string& config,
                               std::unique_ptr<torch::optim::Optimizer> optimizer = nullptr,
                               LRSchedulerFactory lr_scheduler = nullptr,
                               std::shared_ptr<Mpu> mpu = nullptr) {
  return initialize(std::move(model), load_config(config, mpu.get()), std::move(optimizer),
                    std::move(lr_scheduler), mpu);
}

template <typename Module>
Initialized<Module> initialize(std::shared_ptr<Module> model, const json& config,
                               std::unique_ptr<torch::optim::Optimizer> optimizer = nullptr,
                               LRSchedulerFactory lr_scheduler = nullptr,
                               std::shared_ptr<Mpu> mpu = nullptr) {
  return initialize(std::move(model), load_config(config, mpu.get()), std::move(optimizer),
                    std::move(lr_scheduler), mpu);
}

template <typename Module>
Initialized<Module> initialize(std::shared_ptr<Module> model, const char* config,
                               std::unique_ptr<torch::optim::Optimizer> optimizer = nullptr,
                               LRSchedulerFactory lr_scheduler = nullptr,
                               std::shared_ptr<Mpu> mpu = nullptr) {
  return initialize(std::move(model), std::string(config), std::move(optimizer),
                    std::move(lr_scheduler), std::move(mpu));
}

/// DeepSpeed's `model_parameters` as param groups: the config's optimizer is built over these
/// groups, each group's options overriding optimizer.params (e.g. {"weight_decay": 0.0} for
/// biases and norms). Parameters in no group are not trained. `config` is a DeepSpeedConfig, a
/// json, a path, JSON text or base64 JSON.
template <typename Module, typename Config>
Initialized<Module> initialize(std::shared_ptr<Module> model, const Config& config,
                               std::vector<ParamGroup> model_parameters,
                               LRSchedulerFactory lr_scheduler = nullptr,
                               std::shared_ptr<Mpu> mpu = nullptr) {
  if (!model) throw UsageError("deepspeed::initialize requires a model");
  DeepSpeedConfig resolved;
  if constexpr (std::is_same_v<Config, DeepSpeedConfig>) {
    resolved = config;
  } else if constexpr (std::is_same_v<Config, json>) {
    resolved = load_config(config, mpu.get());
  } else {
    resolved = load_config(std::string(config), mpu.get());
  }
  auto engine = std::make_shared<ModuleEngine<Module>>(
      model, std::move(resolved), nullptr, std::move(lr_scheduler), std::move(model_parameters),
      std::move(mpu));
  return {engine, engine->optimizer(), engine->lr_scheduler()};
}

}  // namespace deepspeed
