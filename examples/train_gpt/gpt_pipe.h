// The example GPT as pipeline layer specs (DeepSpeed's GPT2ModelPipe shape): the embedding
// (token + position, tied under key "embed"), the blocks, the final LayerNorm and the output
// head, which multiplies by the tied token embedding. Built for --pipeline_parallel_size.
#pragma once

#include <vector>

#include "deepspeed/pipe.h"
#include "gpt_model.h"

namespace deepspeed::examples {

/// Token + position embedding: idx [B, T] -> [B, T, n_embd]. Weights N(0, 0.02) as GPT-2.
class GptEmbeddingImpl : public torch::nn::Module {
 public:
  explicit GptEmbeddingImpl(const GptConfig& cfg);
  torch::Tensor forward(const torch::Tensor& idx);

  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
};
TORCH_MODULE(GptEmbedding);

/// embedding | n_layer x Block | ln_f | head (x @ wte^T), with `wte.weight` tied between the
/// first and the last layer.
std::vector<pipe::LayerSpec> gpt_pipeline_specs(const GptConfig& cfg);
/// Mean cross-entropy of logits [B, T, V] against targets [B, T] (the pipeline's loss_fn).
torch::Tensor gpt_pipeline_loss(const torch::Tensor& logits, const torch::Tensor& targets);
/// The same loss through chunked_cross_entropy (--lm_loss chunked).
torch::Tensor gpt_pipeline_chunked_loss(const torch::Tensor& logits, const torch::Tensor& targets);

}  // namespace deepspeed::examples
