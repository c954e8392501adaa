// Forward + backward of a causal LM's loss from its last hidden states h [N, D] and output
// projection W [V, D] (both trained), in one of three forms:
//   libtorch  cross_entropy over (h @ W^T).float(), as plain LibTorch code writes it;
//   chunked   deepspeed::chunked_cross_entropy over h @ W^T (no fp32 [N, V] tensors);
//   fused     deepspeed::linear_cross_entropy(h, W) (no logits at all).
// Prints "step_ms=<median> step_peak_mb=<resident peak of a step above the memory before it>
// loss=<loss>". Usage: cross_entropy_bench libtorch|chunked|fused N D V fp32|bf16 [ITERS [BLOCK]]
// (BLOCK: chunked's block_rows or fused's chunk_size; default theirs).
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "deepspeed/cross_entropy.h"
#include "common/resident_peak.h"

using deepspeed::bench::reset_resident_peak;
using deepspeed::bench::status_mib;

int main(int argc, char** argv) {
  if (argc < 6) {
    std::fprintf(stderr, "usage: cross_entropy_bench libtorch|chunked|fused N D V fp32|bf16 "
                         "[ITERS [BLOCK]]\n");
    return 2;
  }
  const std::string form = argv[1];
  const int64_t N = std::stoll(argv[2]), D = std::stoll(argv[3]), V = std::stoll(argv[4]);
  const auto dtype = std::string(argv[5]) == "bf16" ? torch::kBFloat16 : torch::kFloat;
  const int iters = argc > 6 ? std::stoi(argv[6]) : 3;
  const std::optional<int64_t> block =
      argc > 7 ? std::optional<int64_t>(std::stoll(argv[7])) : std::nullopt;
  if (form != "libtorch" && form != "chunked" && form != "fused") {
    std::fprintf(stderr, "cross_entropy_bench: unknown form %s\n", form.c_str());
    return 2;
  }

  torch::manual_seed(0);
  const at::Tensor h = torch::randn({N, D}).to(dtype).requires_grad_();
  const at::Tensor w = (torch::randn({V, D}) * 0.02).to(dtype).requires_grad_();
  const at::Tensor target = torch::randint(V, {N}, torch::kLong);
  deepspeed::LinearCrossEntropyOptions fused;
  fused.chunk_size = block;
  deepspeed::ChunkedCrossEntropyOptions chunked;
  chunked.block_rows = block;
  auto loss_of = [&] {
    if (form == "fused") return deepspeed::linear_cross_entropy(h, w, target, fused);
    const at::Tensor logits = torch::mm(h, w.t());
    if (form == "chunked") return deepspeed::chunked_cross_entropy(logits, target, chunked);
    return torch::nn::functional::cross_entropy(logits.to(torch::kFloat), target);
  };

  std::vector<double> ms;
  double peak = 0, loss = 0;
  for (int i = 0; i < iters + 1; ++i) {  // the first is a warm-up
    h.mutable_grad().reset();
    w.mutable_grad().reset();
    const double before = status_mib("VmRSS");
    reset_resident_peak();
    const auto start = std::chrono::steady_clock::now();
    const at::Tensor l = loss_of();
    l.backward();
    const auto stop = std::chrono::steady_clock::now();
    peak = std::max(peak, status_mib("VmHWM") - before);
    loss = l.item<double>();
    if (i > 0) ms.push_back(std::chrono::duration<double, std::milli>(stop - start).count());
  }
  std::sort(ms.begin(), ms.end());
  std::printf("step_ms=%.1f step_peak_mb=%.0f loss=%.6f\n", ms[ms.size() / 2], peak, loss);
  return 0;
}
