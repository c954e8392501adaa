// What a ZeRO stage's checkpoint methods (ZeroOptimizer's save and load half) receive from the
// engine and hand back. A stage owns its part of the files: stages 0-2 in
// flat_zero_optimizer.cpp, stage 3 in stage3_checkpoint.cpp. The engine (engine_checkpoint.cpp)
// owns what every stage shares: the module, the scheduler, the counters, the RNG states, the
// client state, `latest`, and the ranks' agreement.
#pragma once

#include <functional>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include "deepspeed/checkpoint.h"
#include "deepspeed/config.h"

namespace torch::nn {
class Module;
}
namespace torch::optim {
class Optimizer;
}

namespace deepspeed::runtime {

struct ZeroLoadPlan;

/// The engine's side of a save or a load, as a stage needs it.
struct ZeroCheckpointContext {
  const DeepSpeedConfig* config = nullptr;
  torch::optim::Optimizer* optimizer = nullptr;  // the inner optimizer (its param groups are
                                                 // the stage's flats)
  torch::nn::Module* module = nullptr;
  std::string tag_dir;  // <dir>/<tag>
  int mp_rank = 0;      // model-parallel rank: which mp_rank_XX files
  /// The engine's loss-scaler state_dict (a fixed scale of 1 without fp16), and the same as
  /// the ZeRO files store it.
  nlohmann::json loss_scaler;
  checkpoint::LossScalerState loss_scaler_state;
  bool python_objects = false;  // DS_CHECKPOINT_PYTHON_OBJECTS: DeepSpeed's pickled classes
  std::vector<std::pair<std::string, std::string>> shared_params;  // tied: alias -> source
  bool exclude_frozen_parameters = false;  // save
  /// save: how files beside the stage's own are written (the engine's checkpoint writer).
  checkpoint::FileSaver save_file = [](const c10::IValue& value, const std::string& path) {
    checkpoint::save(value, path);
  };
  bool want_optimizer = false;      // load: optimizer state (and masters, scaler) asked for
  bool load_module_strict = true;   // load: the module's names must match the checkpoint's
  /// Load: the engine's checks of the shared parts (module names and shapes, the saved stage
  /// when the optimizer state is wanted, scheduler, RNG). A stage calls it once, right after
  /// `plan->states` is read and before it reads anything that depends on the model matching.
  std::function<void(ZeroLoadPlan*)> check_model_states;
};

/// A checkpoint read and checked for this rank, not yet applied.
struct ZeroLoadPlan {
  std::string model_file;          // the model-states file this rank read
  c10::IValue raw_states;          // its contents, for the client state
  checkpoint::ModelStates states;  // the same, parsed
  /// Module entries that stand for partitioned parameters (ZeRO-3 placeholders): checked by
  /// name only; the parameters come from the masters.
  std::set<std::string> placeholders;
  bool load_optimizer = false;  // optimizer state, masters and scaler come from the files
  bool optimizer_in_model_states = false;  // stage 0: the optimizer is the 'optimizer' part
  c10::IValue optimizer_state;             // for optim::load_optimizer_state_dict
  std::optional<nlohmann::json> loss_scaler;
  std::vector<at::Tensor> masters;  // per flat group or sub-group: this rank's fp32 partition
  std::vector<at::Tensor> frozen;   // ZeRO-3: per frozen shard, this rank's
  std::string masters_note;         // what the load line says about the masters
};

/// A ZeRO file's loss-scaler state as the engine's LossScaler state_dict.
nlohmann::json loss_scaler_json(const checkpoint::LossScalerState& state);

}  // namespace deepspeed::runtime
