// What init_compression set up on each Linear and Embedding layer (DeepSpeed keeps it as
// attributes of its LinearLayer_Compress / Embedding_Compress and of their weights): the
// techniques, their settings and the scheduler's switches. Tensors (masks, scores, the static
// activation range) live on the layer itself, registered under DeepSpeed's names.
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include "deepspeed/compression_config.h"

namespace deepspeed::compression {

struct LayerState {
  std::string name;  // the module name init_compression found it under
  std::weak_ptr<torch::nn::Module> module;
  torch::nn::LinearImpl* linear = nullptr;        // one of these three
  torch::nn::EmbeddingImpl* embedding = nullptr;
  torch::nn::Conv2dImpl* conv = nullptr;

  // weight_quantization (DeepSpeed's weight.start_bits / target_bits / q_period)
  bool weight_quantization = false;  // configured
  int64_t start_bits = 0, target_bits = 0, q_period = 0;
  bool quantize_in_forward = false;
  std::string quantization_type;
  int64_t quantize_groups = 1;
  bool weight_quantization_enabled = false;  // switched on by the scheduler

  // sparse / row / head / channel pruning: method "" once fixed (or never configured)
  std::string sparse_method, row_method, head_method, channel_method;
  double sparse_ratio = 0.0, row_ratio = 0.0, head_ratio = 0.0, channel_ratio = 0.0;
  int64_t num_heads = 0;
  bool sparse_pruning_enabled = false, row_pruning_enabled = false,
       head_pruning_enabled = false, channel_pruning_enabled = false;

  // activation_quantization: "symmetric_dynamic", "asymmetric_static", ...
  std::string activation_method;
  int64_t activation_bits = 0;
  bool activation_quantization_enabled = false;

  at::Tensor& weight() const;
  bool training() const;
};

/// The state of `module` (nullptr: not compressed, or the module is gone).
std::shared_ptr<LayerState> find_layer_state(const torch::nn::Module* module);
/// The state of `module`, created on first use.
std::shared_ptr<LayerState> layer_state(const std::shared_ptr<torch::nn::Module>& module,
                                        const std::string& name);

/// DeepSpeed's is_module_compressible: Linear, Embedding, Conv2d and BatchNorm2d (which only
/// shrinks with a channel-pruned convolution, as a related module).
bool is_compressible(const torch::nn::Module& module);
bool is_batch_norm(const torch::nn::Module& module);

/// The module names of `model` (named_modules order) whose name `pattern` is found in, each
/// compressible; "*" alone matches all of them. A BatchNorm2d found where it is not a
/// `related` module is an error naming `what` (the technique and group).
std::vector<std::string> matching_layers(const torch::nn::Module& model,
                                         const std::string& pattern, const std::string& what,
                                         bool related = false);

/// DeepSpeed's get_module_name over a group's patterns: per pattern, the layers it finds, each
/// once per technique. `seen` holds the technique's layers so far; strict (init_compression,
/// redundancy_clean): a layer found again is an error naming it and the group; otherwise (the
/// scheduler) it is skipped.
std::vector<std::vector<std::string>> group_layers(const torch::nn::Module& model,
                                                   const std::string& technique,
                                                   const GroupConfig& group,
                                                   std::set<std::string>& seen, bool strict);

/// The named module of `model` (an error naming `why` when there is none).
std::shared_ptr<torch::nn::Module> module_named(const torch::nn::Module& model,
                                                const std::string& name, const std::string& why);

}  // namespace deepspeed::compression
