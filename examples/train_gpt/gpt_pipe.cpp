// The example GPT as pipeline layer specs (see gpt_pipe.h).
#include "gpt_pipe.h"

#include <torch/torch.h>

#include "deepspeed/cross_entropy.h"

namespace deepspeed::examples {

GptEmbeddingImpl::GptEmbeddingImpl(const GptConfig& cfg) {
  wte = register_module("wte", torch::nn::Embedding(cfg.vocab_size, cfg.n_embd));
  wpe = register_module("wpe", torch::nn::Embedding(cfg.block_size, cfg.n_embd));
  torch::NoGradGuard no_grad;
  wte->weight.normal_(0.0, 0.02);
  wpe->weight.normal_(0.0, 0.02);
}

torch::Tensor GptEmbeddingImpl::forward(const torch::Tensor& idx) {
  auto pos = torch::arange(idx.size(1), idx.options().dtype(torch::kLong));
  return wte(idx) + wpe(pos);
}

namespace {

// Block `index` (an MoE block when cfg.moe says so, its load-balancing loss then the layer's
// auxiliary loss).
pipe::LayerSpec block_spec(const GptConfig& cfg, int64_t index) {
  pipe::LayerSpec s;
  s.type_name = "Block";
  s.build = [cfg, index] {
    auto block = Block(cfg, index).ptr();
    pipe::Layer layer{block, [block](const torch::Tensor& x) { return block->forward(x); }};
    if (block->moe_mlp) layer.aux_loss = [block] { return block->l_aux; };
    return layer;
  };
  return s;
}

}  // namespace

std::vector<pipe::LayerSpec> gpt_pipeline_specs(const GptConfig& cfg) {
  using pipe::LayerSpec;
  std::vector<LayerSpec> specs;
  LayerSpec embed = LayerSpec::of<GptEmbedding>("GptEmbedding", cfg);
  specs.push_back(pipe::TiedLayerSpec("embed", embed, nullptr, {"wte.weight"}));
  for (int64_t i = 0; i < cfg.n_layer; ++i) specs.push_back(block_spec(cfg, i));
  specs.push_back(LayerSpec::of<torch::nn::LayerNorm>(
      "LayerNorm", torch::nn::LayerNormOptions(std::vector<int64_t>{cfg.n_embd})));
  specs.push_back(pipe::TiedLayerSpec(
      "embed", embed,
      [](torch::nn::Module& m, const torch::Tensor& x) {
        return torch::matmul(x, dynamic_cast<GptEmbeddingImpl&>(m).wte->weight.t());
      },
      {"wte.weight"}));
  return specs;
}

torch::Tensor gpt_pipeline_loss(const torch::Tensor& logits, const torch::Tensor& targets) {
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}),
                                              targets.reshape({-1}));
}

torch::Tensor gpt_pipeline_chunked_loss(const torch::Tensor& logits, const torch::Tensor& targets) {
  return chunked_cross_entropy(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}));
}

}  // namespace deepspeed::examples
