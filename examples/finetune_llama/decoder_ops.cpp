// Shared decoder arithmetic (see decoder_ops.h), in transformers' eager operation order.
#include "decoder_ops.h"

#include <limits>
#include <optional>

#include <torch/torch.h>

namespace deepspeed::examples {
namespace {

torch::Tensor rotate_half(const torch::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return torch::cat({-x.slice(-1, half), x.slice(-1, 0, half)}, -1);
}

}  // namespace

linear::OptimizedLinear decoder_projection(const LlamaConfig& cfg, const std::string& name,
                                           int64_t in, int64_t out, bool bias) {
  std::optional<linear::LoRAConfig> lora;
  if (cfg.lora) {
    for (const auto& t : cfg.lora->target_mods) {
      if (name.find(t) != std::string::npos) lora = cfg.lora;
    }
  }
  return linear::OptimizedLinear(in, out, bias, lora, std::nullopt, at::kFloat);
}

at::Tensor rotate(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t rotary = cos.size(-1);
  if (rotary == x.size(-1)) return x * cos + rotate_half(x) * sin;
  const auto turned = x.slice(-1, 0, rotary);
  return torch::cat({turned * cos + rotate_half(turned) * sin, x.slice(-1, rotary)}, -1);
}

at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            double scaling, int64_t sliding_window, double softcap) {
  const int64_t T = q.size(2), S = k.size(2), past = S - T;
  auto att = torch::matmul(q, k.transpose(2, 3)) * scaling;
  if (softcap > 0) att = torch::tanh(att / softcap) * softcap;  // Gemma 2, before the mask
  // Query i (absolute position past + i) sees keys 0 .. past + i; with a sliding window W only
  // keys past + i - W + 1 .. past + i, as transformers' Mistral masks them.
  auto hidden = torch::ones({T, S}, torch::kBool).triu(past + 1);
  if (sliding_window > 0 && past + T > sliding_window) {
    hidden = hidden | torch::ones({T, S}, torch::kBool).tril(past - sliding_window);
  }
  att = att.masked_fill(hidden, -std::numeric_limits<float>::infinity());
  att = torch::softmax(att.to(torch::kFloat), -1).to(q.scalar_type());
  return torch::matmul(att, v);
}

}  // namespace deepspeed::examples
