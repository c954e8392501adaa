// Forward + backward of causal self-attention over [1, H, T, D] queries, keys and values:
// "sparse" through block_sparse_attention with a fixed unidirectional layout (DeepSpeed's
// default pattern: local windows of 4 blocks, the last block of each window global), causal,
// "dense" through deepspeed::nn::causal_attention (the T x T scores written out, as LibTorch's CPU
// path is). Prints "step_ms=<median> peak_mb=<resident peak> sum=<checksum>". Usage:
// sparse_attention_bench sparse|dense T [H D BLOCK ITERS]
#include <sys/resource.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "deepspeed/causal_attention.h"
#include "deepspeed/sparse_attention.h"

namespace sa = deepspeed::sparse_attention;

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: sparse_attention_bench sparse|dense T [H D BLOCK ITERS]\n");
    return 2;
  }
  const bool sparse = std::string(argv[1]) == "sparse";
  const int64_t T = std::stoll(argv[2]);
  const int64_t H = argc > 3 ? std::stoll(argv[3]) : 8;
  const int64_t D = argc > 4 ? std::stoll(argv[4]) : 64;
  const int64_t block = argc > 5 ? std::stoll(argv[5]) : 64;
  const int iters = argc > 6 ? std::stoi(argv[6]) : 5;

  torch::manual_seed(0);
  auto make = [&] { return torch::randn({1, H, T, D}).requires_grad_(true); };
  const at::Tensor q = make(), k = make(), v = make();
  sa::SparseAttentionConfig config;
  config.block = block;
  config.attention = "unidirectional";
  const at::Tensor layout = sa::SparsityConfig(H, config).make_layout(T);
  sa::AttentionExtras extras;
  extras.causal = true;  // no T x T mask
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));

  std::vector<double> ms;
  double checksum = 0.0;
  for (int i = 0; i < iters + 1; ++i) {  // the first is a warm-up
    const auto start = std::chrono::steady_clock::now();
    const at::Tensor out = sparse
                               ? sa::block_sparse_attention(q, k, v, layout, block, scale, extras)
                               : deepspeed::nn::causal_attention(q, k, v, 0.0, /*training=*/true);
    out.sum().backward();
    const auto stop = std::chrono::steady_clock::now();
    checksum = out.sum().item<double>();
    q.mutable_grad().reset();
    k.mutable_grad().reset();
    v.mutable_grad().reset();
    if (i > 0) ms.push_back(std::chrono::duration<double, std::milli>(stop - start).count());
  }
  std::sort(ms.begin(), ms.end());
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  std::printf("step_ms=%.2f peak_mb=%.0f sum=%.6f kept=%.3f\n", ms[ms.size() / 2],
              usage.ru_maxrss / 1024.0, checksum,
              layout.sum().item<double>() / static_cast<double>(layout.numel()));
  return 0;
}
