// DeepSpeed's deepspeed.linear: OptimizedLinear, a drop-in Linear with LoRA adapters over a
// frozen base weight, optionally sharded over the ranks (LoRAConfig.base_weight_sharding).
//
//   OptimizedLinear(in, out)                  a plain Linear (weight [out, in], trainable)
//   OptimizedLinear(in, out, ..., LoRAConfig) y = x W^T + (lora_alpha / lora_r) B(A(x)):
//       `weight` frozen, `lora_weight_1` (A, [r, in], Kaiming-uniform) and `lora_weight_2`
//       (B, [out, r], zeros) trainable, under DeepSpeed's parameter names. With
//       base_weight_sharding = world size, each rank keeps a flat 1/world of W (DeepSpeed's
//       layout: rank k holds elements [k, k + 1) * out * in / world of W flattened) and every
//       forward all-gathers it.
//
// init_lora(model) freezes every parameter of `model` and creates the adapters of each LoRA
// OptimizedLinear (deepspeed.linear.init_lora). load_base_weight() loads a pretrained [out, in]
// weight as DeepSpeed's _load_from_state_dict does (a module whose name matches none of
// target_mods becomes a plain frozen Linear). The engine does not broadcast sharded base weights
// and leaves them out of checkpoints (they come from the model file; DeepSpeed saves rank 0's
// shard alone, from which no other rank could resume). QuantizationConfig (DeepSpeed's CUDA FP
// quantizer) and LoRAConfig.offload / offload_ratio (which in DeepSpeed work on quantized base
// weights only) are refused by name. See docs/linear.md.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

namespace deepspeed::linear {

struct LoRAConfig {
  int64_t lora_r = 64;
  double lora_alpha = 16.0;
  int64_t base_weight_sharding = 1;  // 1: whole base weight on each rank; else the world size
  bool offload = false;              // refused (see above)
  double offload_ratio = 0.0;        // refused unless 0
  bool delay_lora_init = false;      // adapters made by init_lora() instead of the constructor
  std::vector<std::string> target_mods = {"q_proj",    "k_proj", "v_proj",  "o_proj",
                                          "gate_proj", "up_proj", "down_proj"};
};

struct QuantizationConfig {
  int64_t q_bits = 8;
  int64_t mantissa_bits = 3;
  int64_t group_size = 512;
};

class OptimizedLinearImpl : public torch::nn::Module {
 public:
  /// DeepSpeed's defaults: no bias, bfloat16. With LoRA a bias (which DeepSpeed refuses) is
  /// frozen with the base weight and never sharded. Throws UsageError for a sharding degree other
  /// than 1 and the world size or not dividing `input_dim`, lora_r < 1; NotSupportedError for a
  /// QuantizationConfig, offload or offload_ratio.
  OptimizedLinearImpl(int64_t input_dim, int64_t output_dim, bool bias = false,
                      std::optional<LoRAConfig> lora_config = std::nullopt,
                      std::optional<QuantizationConfig> quantization_config = std::nullopt,
                      at::ScalarType dtype = at::kBFloat16);

  at::Tensor forward(const at::Tensor& input);

  /// Creates the adapters (once; later calls make them trainable again) and freezes the base
  /// weight. No-op when disabled.
  void init_lora();
  /// Back to a plain frozen Linear with a whole [out, in] weight (DeepSpeed's disable()).
  void disable();
  /// Loads the pretrained [out, in] `full` weight: this rank's shard of it, or, when `name`
  /// (the module's qualified name) contains none of target_mods, the whole weight after
  /// disable(). Throws UsageError naming the module for a wrong shape.
  void load_base_weight(const at::Tensor& full, const std::string& name = "");
  /// The whole [out, in] base weight (an all-gather over the world when sharded).
  at::Tensor full_weight();
  /// full_weight() + (lora_alpha / lora_r) B A: the plain Linear weight the adapters amount to.
  at::Tensor merged_weight();

  bool lora_enabled() const { return lora_.has_value() && !disabled_; }
  bool sharded() const { return lora_enabled() && shards_ > 1; }
  double scaling() const {
    return lora_ ? lora_->lora_alpha / static_cast<double>(lora_->lora_r) : 1.0;
  }
  int64_t input_dim() const { return input_dim_; }
  int64_t output_dim() const { return output_dim_; }

  at::Tensor weight, bias;
  torch::nn::Linear lora_weight_1{nullptr}, lora_weight_2{nullptr};

 private:
  int64_t input_dim_, output_dim_;
  std::optional<LoRAConfig> lora_;
  at::ScalarType dtype_;
  int64_t shards_ = 1;
  bool disabled_ = false, initialized_ = false;
};
TORCH_MODULE(OptimizedLinear);

/// Freezes every parameter of `model`, then runs init_lora() on each LoRA OptimizedLinear in it
/// (deepspeed.linear.init_lora).
void init_lora(torch::nn::Module& model);

/// Whether `param` is a base weight sharded over the ranks (DeepSpeed's ds_optim_param on a
/// sharded LoRAOptimizedLinear): not broadcast by the engine, not in checkpoints.
bool is_sharded_base_weight(const at::Tensor& param);

}  // namespace deepspeed::linear
