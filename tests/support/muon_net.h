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
    const at::Tensor h = torch::tanh(c_fc(x));
    const at::Tensor y = x + c_proj(h) + 0.5 * mix(x);
    const at::Tensor logits = lm_head(y).to(at::kFloat);
    return torch::nn::functional::cross_entropy(logits.view({-1, kMuonVocab}), targets.view(-1));
  }
  torch::nn::Embedding embed;
  torch::nn::Linear c_fc, c_proj, mix, lm_head;
};
TORCH_MODULE(MuonNet);

}  // namespace deepspeed::testing
