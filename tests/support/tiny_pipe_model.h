// A tiny GPT-shaped model as pipeline layer specs (tied embedding / head, tanh blocks, a layer
// norm), the same model as one ordinary module for single-process references, and its data.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "deepspeed/pipe.h"

namespace deepspeed::testing {

constexpr int64_t kPipeVocab = 16;
constexpr int64_t kPipeHidden = 8;
constexpr int64_t kPipeSeq = 4;

struct TinyBlockImpl : torch::nn::Module {
  TinyBlockImpl() { fc = register_module("fc", torch::nn::Linear(kPipeHidden, kPipeHidden)); }
  at::Tensor forward(const at::Tensor& x) { return x + torch::tanh(fc(x)); }
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(TinyBlock);

/// embedding (tied "embed") | `blocks` x Block | LayerNorm | head (tied "embed": x @ W^T).
inline std::vector<pipe::LayerSpec> tiny_pipe_specs(int blocks = 4) {
  using pipe::LayerSpec;
  std::vector<LayerSpec> specs;
  LayerSpec embed = LayerSpec::of<torch::nn::Embedding>(
      "Embedding", torch::nn::EmbeddingOptions(kPipeVocab, kPipeHidden));
  specs.push_back(pipe::TiedLayerSpec("embed", embed));
  for (int i = 0; i < blocks; ++i) specs.push_back(LayerSpec::of<TinyBlock>("Block"));
  specs.push_back(LayerSpec::of<torch::nn::LayerNorm>(
      "LayerNorm", torch::nn::LayerNormOptions(std::vector<int64_t>{kPipeHidden})));
  specs.push_back(pipe::TiedLayerSpec("embed", embed, [](torch::nn::Module& m, const at::Tensor& x) {
    auto& e = dynamic_cast<torch::nn::EmbeddingImpl&>(m);
    return torch::matmul(x, e.weight.t());
  }));
  return specs;
}

inline at::Tensor tiny_pipe_loss(const at::Tensor& logits, const at::Tensor& labels) {
  return torch::nn::functional::cross_entropy(logits.reshape({-1, kPipeVocab}).to(at::kFloat),
                                              labels.reshape({-1}));
}

/// Micro-batch `index` of `micro` sequences (identical in every process).
inline std::pair<at::Tensor, at::Tensor> tiny_pipe_batch(int64_t index, int64_t micro) {
  auto pos = torch::arange(micro * (kPipeSeq + 1), torch::kLong).reshape({micro, kPipeSeq + 1});
  auto tokens = (pos * 5 + index * 3 + (pos * pos) % 7) % kPipeVocab;
  return {tokens.narrow(1, 0, kPipeSeq).contiguous(), tokens.narrow(1, 1, kPipeSeq).contiguous()};
}

/// The same model as one module, built the way seed_layers builds each layer (seed
/// base_seed + layer index), with the pipeline's parameter names ("<layer>.", and
/// "tied_modules.embed." for the tied embedding).
struct TinyPipeReferenceImpl : torch::nn::Module {
  explicit TinyPipeReferenceImpl(int blocks = 4, int64_t base_seed = 1234) {
    auto specs = tiny_pipe_specs(blocks);
    auto tied = register_module("tied_modules", std::make_shared<torch::nn::Module>());
    std::shared_ptr<torch::nn::Module> embed;
    std::function<at::Tensor(const at::Tensor&)> embed_forward;
    for (size_t i = 0; i < specs.size(); ++i) {
      torch::manual_seed(static_cast<uint64_t>(base_seed + static_cast<int64_t>(i)));
      if (!specs[i].tied_key.empty()) {
        if (!embed) {
          pipe::Layer l = specs[i].build();
          embed = l.module;
          embed_forward = l.forward;
          tied->register_module("embed", embed);
        }
        if (specs[i].tied_forward) {
          auto fn = specs[i].tied_forward;
          auto m = embed;
          funcs.push_back([fn, m](const at::Tensor& x) { return fn(*m, x); });
        } else {
          funcs.push_back(embed_forward);
        }
        continue;
      }
      pipe::Layer l = specs[i].build();
      if (l.module) register_module(std::to_string(i), l.module);
      funcs.push_back(l.forward);
    }
  }
  at::Tensor forward(const at::Tensor& x, const at::Tensor& y) {
    at::Tensor h = x;
    for (auto& f : funcs) h = f(h);
    return tiny_pipe_loss(h, y);
  }
  std::vector<std::function<at::Tensor(const at::Tensor&)>> funcs;
};

}  // namespace deepspeed::testing
