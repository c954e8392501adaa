// DeepSpeed Compression (compression_training): weight quantization (in the forward, or MoQ
// after each fp16 optimizer step), activation quantization, sparse, row, head and channel
// pruning, and layer reduction, scheduled by training step. As in DeepSpeed:
//
//   auto cfg = deepspeed::compression::compression_config(ds_config);
//   deepspeed::compression::init_compression(*model, cfg);   // before deepspeed::initialize
//   auto engine = deepspeed::initialize(...);   // steps the compression scheduler
//   ... train ...
//   deepspeed::compression::redundancy_clean(*model, cfg);   // masks applied, layers shrunk
//
// Python DeepSpeed swaps each nn.Linear for a LinearLayer_Compress. C++ modules keep their
// typed members, so here the layer stays a torch::nn::Linear (Embedding, Conv2d), DeepSpeed's
// masks and scores are registered on it under DeepSpeed's names (sparse_pruning_mask,
// row_mask_scores, head_pruning_scores, ...: checkpoints carry them), and the model calls the
// compressed forward through compression::linear() / embedding() / conv2d() (or
// tensor_parallel::linear(), which falls back to linear()). A layer init_compression did not
// touch runs its plain forward.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include "deepspeed/compression_config.h"

namespace deepspeed::compression {

/// The layers each technique applies to, by module name (DeepSpeed's get_compress_methods).
struct CompressionPlan {
  /// technique name -> group name -> the layer names the group's patterns found.
  std::map<std::string, std::map<std::string, std::vector<std::string>>> layers;
  std::string describe() const;
};

/// DeepSpeed's init_compression: finds the Linear and Embedding layers each enabled technique's
/// groups name (re.search of each pattern in the module name; a layer named twice in one
/// technique is an error naming it and the group), sets each up (l1 masks computed now from the
/// weights, topk scores registered as parameters initialised kaiming-uniform as DeepSpeed's),
/// and with layer_reduction first copies `teacher`'s layers into `model`. Call it on the whole
/// model before deepspeed::initialize (the optimizer must see the scores). Techniques start
/// off; the engine's compression scheduler switches each on at its schedule_offset.
CompressionPlan init_compression(torch::nn::Module& model, const CompressionConfig& config,
                                 torch::nn::Module* teacher = nullptr);

/// DeepSpeed's redundancy_clean: makes the compression permanent, in DeepSpeed's order (weight
/// quantization in forward, sparse, row, head pruning, activation quantization stays in the
/// forward): masks multiplied into the weights and removed with their scores; with
/// related_modules, pruned rows (heads) are cut out of the layer and the matching input columns
/// out of its related layers, so the layers shrink. Call it after training, before export.
void redundancy_clean(torch::nn::Module& model, const CompressionConfig& config);

/// The compressed forward of `layer` (DeepSpeed's LinearLayer_Compress.forward): the weight
/// quantized (straight-through), masked by sparse, row and head pruning, the input quantized,
/// each as far as the scheduler has switched it on. A layer without compression: its forward.
at::Tensor linear(const torch::nn::Linear& layer, const at::Tensor& x);
/// Embedding_Compress.forward: the table quantized token-wise when switched on.
at::Tensor embedding(const torch::nn::Embedding& layer, const at::Tensor& indices);
/// Conv2dLayer_Compress.forward: the weight quantized, masked by sparse and channel pruning,
/// the input quantized per sample (dynamic) or over a running range (static).
at::Tensor conv2d(const torch::nn::Conv2d& layer, const at::Tensor& x);
/// Whether init_compression set up `layer`.
bool is_compressed(const torch::nn::Module& layer);

/// DeepSpeed's compression_scheduler: switches each technique on for its groups' layers once
/// the training step reaches its schedule_offset (sparse pruning: within [schedule_offset,
/// schedule_offset_end]); the engine steps it after every applied optimizer step.
class CompressionScheduler {
 public:
  CompressionScheduler(torch::nn::Module& model, CompressionConfig config);
  CompressionScheduler(const CompressionScheduler&) = delete;  // its switches point into config_
  CompressionScheduler& operator=(const CompressionScheduler&) = delete;
  /// step_zero_check: the check before the first step (the engine's forward at global step 0),
  /// which does not count a step.
  void step(bool step_zero_check = false);
  int64_t training_steps() const { return training_steps_; }
  /// Restores the count (a resumed run: the applied steps so far) and switches on what is due.
  void set_training_steps(int64_t steps);
  /// Whether weight quantization has been switched on (MoQ quantizes from then on).
  bool weight_quantization_enabled() const { return weight_quantization_enabled_; }
  const CompressionConfig& config() const { return config_; }

 private:
  struct Switch;
  void check_all();

  CompressionConfig config_;
  std::vector<std::shared_ptr<Switch>> switches_;
  int64_t training_steps_ = 0;
  bool weight_quantization_enabled_ = false;
};

/// MoQ (DeepSpeed's runtime/quantize.py Quantizer): weight quantization with
/// quantize_weight_in_forward false quantizes the 16-bit weights of the layers weight
/// quantization names after each optimizer step without overflow, at start_bits first and one
/// bit fewer each time the step count reaches the layer's period (which then doubles), down to
/// target_bits; 2 bits ternary, 1 bit binary; fp16_mixed_quantize blends the unquantized weight
/// in at a ratio falling by quantize_change_ratio per step.
class MoqQuantizer {
 public:
  MoqQuantizer(torch::nn::Module& model, const TechniqueConfig& weight_quantization);
  /// Quantizes in place (under NoGradGuard). `overflow`: the step was skipped (nothing done).
  void quantize(bool overflow);
  int64_t steps() const { return qsteps_; }
  /// A resumed run: the precision schedule moved on to `steps` quantized steps.
  void set_steps(int64_t steps);
  /// The current precision of a layer's weight (its start_bits as the schedule lowered it).
  int64_t current_bits(const torch::nn::Module& layer) const;

 private:
  struct Layer;
  TechniqueConfig config_;
  std::vector<std::shared_ptr<Layer>> layers_;
  int64_t qsteps_ = 0;
  double real_ratio_ = 1.0;
};

}  // namespace deepspeed::compression
