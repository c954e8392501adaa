// MuonNet: a small language model for the Muon optimizer's tests (muon_dist_test, and
// deepspeed_muon_interop_test, whose Python side defines the same module). With DeepSpeed's
// name rule Muon takes c_fc, c_proj and mix (160 + 160 + 64 elements: with 2 ranks c_proj
// straddles the ZeRO slices at 192); Adam the embedding, the head (by name) and the biases.
#pragma once

#include <torch/torch.h>

namespace deepspeed::testing {

constexpr int64_t kMuonVocab = 16;

struct MuonNetImpl : torch::nn::Module {
  MuonNetImpl()
      : embed(register_module("embed", torch::nn::Embedding(kMuonVocab, 8))),
        c_fc(register_module("c_fc", torch::nn::Linear(8, 20))),
        c_proj(register_module("c_proj", torch::nn::Linear(20, 8))),
        mix(register_module("mix", torch::nn::Linear(torch::nn::LinearOptions(8, 8).bias(false)))),
        lm_head(register_module("lm_head", torch::nn::Linear(8, kMuonVocab))) {}
  at::Tensor forward(const at::Tensor& tokens, const at::Tensor& targets) {
    const at::Tensor x = embed(tokens);
    const at::Tensor h = torch::tanh(linear(c_fc, x));
    const at::Tensor y = x + linear(c_proj, h) + 0.5 * linear(mix, x);
    const at::Tensor logits = linear(lm_head, y).to(at::kFloat);
    return torch::nn::functional::cross_entropy(logits.view({-1, kMuonVocab}), targets.view(-1));
  }
  // Debian's LibTorch 1.13 has no fp16 matmul on CPU: fp16 weights compute in fp32 there (their
  // gradients still come back in fp16, which is what loss scaling is about).
  static at::Tensor linear(torch::nn::Linear& l, const at::Tensor& x) {
    if (l->weight.scalar_type() != at::kHalf) return l(x.to(l->weight.scalar_type()));
    const at::Tensor bias = l->bias.defined() ? l->bias.to(at::kFloat) : at::Tensor();
    return torch::nn::functional::linear(x.to(at::kFloat), l->weight.to(at::kFloat), bias);
  }

  torch::nn::Embedding embed;
  torch::nn::Linear c_fc, c_proj, mix, lm_head;
};
TORCH_MODULE(MuonNet);

}  // namespace deepspeed::testing
