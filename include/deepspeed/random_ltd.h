// Random layerwise token dropping (random-LTD; Yao et al., "Random-LTD: Random and Layerwise
// Token Dropping Brings Efficient Training for Large-scale Transformers", 2022), as DeepSpeed's
// data_efficiency.data_routing.random_ltd drives it. The chosen layers run on a random,
// order-keeping subset of each sequence's tokens; the other tokens skip them and rejoin the
// hidden states unchanged. The subset grows to the whole sequence over the schedule.
//
// The engine owns the schedule (RandomLtdScheduler, saved in checkpoints) and hands it to
// training forwards (ForwardKwargs::random_ltd). DeepSpeed wraps the model's layers in
// RandomLayerTokenDrop modules; in C++ the model keeps its layers and runs each one through
// RandomLayerTokenDrop::forward, so its parameter names stay as they are.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "deepspeed/config.h"

namespace deepspeed {

/// DeepSpeed's RandomLTDScheduler: the number of tokens the dropping layers keep at each global
/// step, and the layer-tokens consumed so far.
class RandomLtdScheduler {
 public:
  /// An enabled section (DeepSpeedConfig validated it); `global_batch_size`: the engine's
  /// train_batch_size, for the consumed layer-tokens.
  RandomLtdScheduler(RandomLtdConfig config, int64_t global_batch_size);

  /// The schedule's kept length at `global_steps`: floor(t / require_steps * (max - min) + min),
  /// rounded down to a multiple of seq_per_step but not below the first multiple at or above
  /// min_value, and at most max_value.
  int64_t get_value(int64_t global_steps) const;

  /// Moves the current length to the schedule's at `global_steps` unless it has reached
  /// max_value, and counts the step's layer-tokens once per step. The engine calls it before
  /// every training forward with its global_steps.
  void update_seq(int64_t global_steps);

  int64_t get_current_seq() const { return current_value_; }
  void set_current_seq(int64_t seq_length) { current_value_ = seq_length; }
  int64_t get_random_ltd_layer_num() const { return config_.random_ltd_layer_num; }
  /// Sum over the steps so far of train_batch_size * (kept length * dropping layers + max_value
  /// * other layers).
  int64_t consumed_layer_tokens() const { return consumed_layer_tokens_; }
  /// The layer-tokens global steps 0 .. train_iters-1 consume from the initial state (DeepSpeed's
  /// get_total_layer_tokens, which a token-based LR decay reads); leaves this scheduler as it is.
  int64_t get_total_layer_tokens(int64_t train_iters) const;

  /// DeepSpeed's state_dict (consumed_layer_tokens, current_steps, current_value, min_value,
  /// max_value): what checkpoints keep under 'random_ltd'.
  nlohmann::json state_dict() const;
  /// Restores it; a missing or mistyped key is a CheckpointError naming `source`.
  void load_state_dict(const nlohmann::json& state, const std::string& source);

  const RandomLtdConfig& config() const { return config_; }

 private:
  RandomLtdConfig config_;
  int64_t global_batch_size_;
  int64_t min_value_, max_value_;  // the checkpoint's, once loaded
  int64_t current_value_;
  int64_t consumed_layer_tokens_ = 0;
  int64_t current_step_ = -1;  // the last step counted
};

/// One forward's token dropping. A model makes one at the start of its forward from
/// ForwardKwargs::random_ltd and runs each of its layers through forward(): the kept tokens of
/// every dropping layer are drawn here, once, from torch's generator (DeepSpeed draws them in its
/// first dropping layer), each layer its own subset.
class RandomLayerTokenDrop {
 public:
  using Layer = std::function<at::Tensor(const at::Tensor& hidden)>;
  using MaskedLayer = std::function<at::Tensor(const at::Tensor& hidden, const at::Tensor& mask)>;

  /// `scheduler`: nullptr (no random-LTD) drops nothing. `hidden`: the hidden states the layers
  /// take, [batch, seq, hidden] or [seq, batch, hidden] as hidden_state_order says. Nothing is
  /// dropped either outside training or once the kept length reaches the sequence's.
  RandomLayerTokenDrop(const RandomLtdScheduler* scheduler, const at::Tensor& hidden,
                       bool training);

  /// Whether this forward drops tokens at all.
  bool active() const { return !indices_.empty(); }
  /// Whether layer `layer` (the model's numbering, as random_ltd_layer_id) drops tokens.
  bool drops(int64_t layer) const { return slot(layer) >= 0; }
  int64_t reserved_length() const { return reserved_; }
  /// The kept positions of a dropping layer, ascending: [batch, reserved_length] int64.
  const at::Tensor& indices(int64_t layer) const;

  /// Layer `layer` of the model on `hidden`: a dropping layer runs on its kept tokens and its
  /// outputs replace them; the other tokens pass through. A layer that drops nothing runs on all.
  at::Tensor forward(int64_t layer, const at::Tensor& hidden, const Layer& fn) const;
  /// The same for a layer that takes an attention mask ([batch, heads or 1, seq, seq]). The
  /// dropping layer gets, as in DeepSpeed, for a "decoder" the mask's leading reserved x reserved
  /// block (a causal mask is the same for any kept subset), for an "encoder" the mask's kept rows
  /// and columns.
  at::Tensor forward(int64_t layer, const at::Tensor& hidden, const at::Tensor& mask,
                     const MaskedLayer& fn) const;

 private:
  int64_t slot(int64_t layer) const;

  const RandomLtdScheduler* scheduler_ = nullptr;
  bool batch_first_ = true;
  int64_t reserved_ = 0;
  std::vector<at::Tensor> indices_;  // per dropping layer, in random_ltd_layer_id order
};

namespace random_ltd {

/// For each of `layers` x `batch` sequences of `seq_length` tokens, `reserved` distinct positions
/// drawn uniformly, ascending: [layers, batch, reserved] int64 on `device`.
at::Tensor sample_tokens(int64_t reserved, int64_t seq_length, int64_t batch, int64_t layers,
                         const at::Device& device);

/// The tokens at `indices` ([batch, reserved]) of `hidden` (3-D, batch_first or seq-first).
at::Tensor gather_tokens(const at::Tensor& hidden, const at::Tensor& indices, bool batch_first);

/// `hidden` with the tokens at `indices` replaced by `part` (out of place; gradients reach
/// `part` at those positions and `hidden` at the others).
at::Tensor scatter_tokens(const at::Tensor& hidden, const at::Tensor& part,
                          const at::Tensor& indices, bool batch_first);

/// The rows and columns `indices` ([batch, reserved]) of an attention mask
/// [batch, heads, seq, seq]: [batch, heads, reserved, reserved].
at::Tensor gather_mask(const at::Tensor& mask, const at::Tensor& indices);

}  // namespace random_ltd
}  // namespace deepspeed
