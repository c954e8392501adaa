// Forward + backward of one dropless token-choice MoE block (deepspeed::moe::TokenChoiceMoE, the
// block of Mixtral and of DeepSpeed's AutoEP) on T tokens of width H: E SwiGLU experts of width
// F, each token to its top K. Prints "step_ms=<median> step_peak_mb=<resident peak of a step
// above the memory before it> out=<sum of the output>".
// Usage: token_choice_moe_bench T H F E K fp32|bf16 [ITERS]
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "deepspeed/auto_ep.h"
#include "common/resident_peak.h"

using deepspeed::bench::reset_resident_peak;
using deepspeed::bench::status_mib;

int main(int argc, char** argv) {
  if (argc < 7) {
    std::fprintf(stderr, "usage: token_choice_moe_bench T H F E K fp32|bf16 [ITERS]\n");
    return 2;
  }
  const int64_t T = std::stoll(argv[1]), H = std::stoll(argv[2]), F = std::stoll(argv[3]);
  const int64_t E = std::stoll(argv[4]), K = std::stoll(argv[5]);
  const auto dtype = std::string(argv[6]) == "bf16" ? torch::kBFloat16 : torch::kFloat;
  const int iters = argc > 7 ? std::stoi(argv[7]) : 3;

  torch::manual_seed(0);
  deepspeed::moe::TokenChoiceOptions o;
  o.num_experts = E;
  o.top_k = K;
  deepspeed::moe::TokenChoiceMoE block(H, F, o);
  block->to(dtype);
  const at::Tensor x = torch::randn({T, H}).to(dtype).requires_grad_();

  std::vector<double> ms;
  double peak = 0, out = 0;
  for (int i = 0; i < iters + 1; ++i) {  // the first is a warm-up
    x.mutable_grad().reset();
    block->zero_grad(/*set_to_none=*/true);
    const double before = status_mib("VmRSS");
    reset_resident_peak();
    const auto start = std::chrono::steady_clock::now();
    const at::Tensor y = block->forward(x);
    y.sum().backward();
    const auto stop = std::chrono::steady_clock::now();
    peak = std::max(peak, status_mib("VmHWM") - before);
    out = y.sum().item<double>();
    if (i > 0) ms.push_back(std::chrono::duration<double, std::milli>(stop - start).count());
  }
  std::sort(ms.begin(), ms.end());
  std::printf("step_ms=%.1f step_peak_mb=%.0f out=%.6f\n", ms[ms.size() / 2], peak, out);
  return 0;
}
