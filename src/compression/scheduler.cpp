// DeepSpeed's compression_scheduler (compression/scheduler.py).
#include <cctype>
#include <set>

#include "compression/layer_state.h"
#include "deepspeed/compression.h"
#include "deepspeed/errors.h"
#include "util/logging.h"

namespace deepspeed::compression {

// One technique's switch: the layers its groups name and the flag it sets on each.
struct CompressionScheduler::Switch {
  std::string technique;
  const TechniqueConfig* config = nullptr;
  std::vector<std::shared_ptr<LayerState>> layers;
  bool announced = false;
};

namespace {

bool& flag_of(LayerState& s, const std::string& technique) {
  if (technique == "weight_quantization") return s.weight_quantization_enabled;
  if (technique == "activation_quantization") return s.activation_quantization_enabled;
  if (technique == "sparse_pruning") return s.sparse_pruning_enabled;
  if (technique == "row_pruning") return s.row_pruning_enabled;
  if (technique == "head_pruning") return s.head_pruning_enabled;
  if (technique == "channel_pruning") return s.channel_pruning_enabled;
  throw NotSupportedError("compression_training." + technique + " is not supported yet");
}

}  // namespace

CompressionScheduler::CompressionScheduler(torch::nn::Module& model, CompressionConfig config)
    : config_(std::move(config)) {
  for (const auto& [technique, t] : config_.techniques()) {
    if (!t->enabled) continue;
    auto sw = std::make_shared<Switch>();
    sw->technique = technique;
    sw->config = t;
    std::set<std::string> seen;
    for (const GroupConfig& g : t->groups) {
      for (const auto& names : group_layers(model, technique, g, seen, /*strict=*/false)) {
        for (const std::string& name : names) {
          auto module = module_named(model, name, "compression scheduler");
          auto state = find_layer_state(module.get());
          // DeepSpeed sets the flag on a plain layer to no effect; here that is an error.
          if (!state) {
            throw UsageError("compression_training." + std::string(technique) +
                             " applies to " + name + ", which init_compression did not set "
                             "up: run deepspeed::compression::init_compression on the model "
                             "before deepspeed::initialize");
          }
          flag_of(*state, technique);  // refuses what the layer cannot do
          sw->layers.push_back(std::move(state));
        }
      }
    }
    switches_.push_back(std::move(sw));
  }
}

void CompressionScheduler::check_all() {
  for (const auto& sw : switches_) {
    const TechniqueConfig& t = *sw->config;
    bool due = training_steps_ >= t.schedule_offset;
    // Matches DeepSpeed: sparse pruning is switched on within [offset, offset_end] only (and
    // stays on).
    if (sw->technique == "sparse_pruning") due = due && training_steps_ <= t.schedule_offset_end;
    if (!due) continue;
    for (const auto& layer : sw->layers) flag_of(*layer, sw->technique) = true;
    if (!sw->announced) {
      sw->announced = true;
      if (sw->technique == "weight_quantization") weight_quantization_enabled_ = true;
      std::string what = sw->technique;
      what[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(what[0])));
      for (auto& ch : what) {
        if (ch == '_') ch = ' ';
      }
      log::info_rank0(what + " is enabled at step " + std::to_string(training_steps_));
    }
  }
}

void CompressionScheduler::step(bool step_zero_check) {
  if (!step_zero_check) training_steps_ += 1;
  check_all();
}

void CompressionScheduler::set_training_steps(int64_t steps) {
  training_steps_ = steps;
  // What a run that had taken these steps switched on: each technique whose offset it passed
  // (sparse pruning's window included: once on, it stays on).
  for (const auto& sw : switches_) {
    if (steps >= sw->config->schedule_offset) {
      for (const auto& layer : sw->layers) flag_of(*layer, sw->technique) = true;
      if (sw->technique == "weight_quantization") weight_quantization_enabled_ = true;
      sw->announced = true;
    }
  }
}

}  // namespace deepspeed::compression
