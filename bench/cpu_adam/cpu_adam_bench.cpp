// One process, every C++ contender on the same buffers, interleaved round by round: STREAM triad,
// the fused AdamW loop, our CPU-Adam on each SIMD path the CPU has, and torch::optim::Adam at
// LibTorch's default thread count, at 1 thread and at --threads. Prints, per variant and size,
//   ROUND <variant>.n<N>M round=<r> median=<s per step>
//   RESULT <variant>.n<N>M median=.. min=.. max=.. n=<rounds> unit=s/step threads=<t> bytes_per_elem=<b>
// where median is over the per-round medians of `--steps` timed steps (after `--warmup` steps
// per round) and min/max are over the per-round medians; bench/cpu_adam/report.py turns these
// into the table and the paired ratios.
#include <omp.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "baselines.h"
#include "ops/cpu_adam/cpu_adam.h"

namespace {

using deepspeed::bench::FusedAdamwStep;
namespace ops = deepspeed::ops;

struct Options {
  std::vector<int64_t> sizes_millions = {10, 100};
  int rounds = 3;
  int steps = 5;
  int warmup = 1;
  int torch_steps = 3;  // torch and our scalar path are ~10x slower: fewer steps
  int threads = 2;
};

[[noreturn]] void usage_error(const std::string& what) {
  std::fprintf(stderr,
               "cpu_adam_bench: %s\nusage: cpu_adam_bench [--sizes 10,100] [--rounds 3] "
               "[--steps 5] [--warmup 1] [--torch_steps 3] [--threads 2]\n",
               what.c_str());
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) usage_error("missing value for " + flag);
    const std::string value = argv[++i];
    if (flag == "--sizes") {
      o.sizes_millions.clear();
      size_t pos = 0;
      while (pos <= value.size()) {
        const size_t comma = value.find(',', pos);
        o.sizes_millions.push_back(std::stoll(value.substr(pos, comma - pos)));
        if (comma == std::string::npos) break;
        pos = comma + 1;
      }
    } else if (flag == "--rounds") {
      o.rounds = std::stoi(value);
    } else if (flag == "--steps") {
      o.steps = std::stoi(value);
    } else if (flag == "--warmup") {
      o.warmup = std::stoi(value);
    } else if (flag == "--torch_steps") {
      o.torch_steps = std::stoi(value);
    } else if (flag == "--threads") {
      o.threads = std::stoi(value);
    } else {
      usage_error("unknown flag " + flag);
    }
  }
  return o;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t k = v.size() / 2;
  return v.size() % 2 ? v[k] : 0.5 * (v[k - 1] + v[k]);
}

/// 64-byte aligned, uninitialised floats (filled by the caller).
struct FloatBuffer {
  explicit FloatBuffer(int64_t n)
      : data(static_cast<float*>(std::aligned_alloc(64, ((n * 4 + 63) / 64) * 64)), std::free) {
    if (!data) usage_error("out of memory allocating " + std::to_string(n) + " floats");
  }
  std::unique_ptr<float, decltype(&std::free)> data;
  float* get() const { return data.get(); }
};

/// A contender: runs one step when called; `threads` is applied before each round.
struct Variant {
  std::string name;
  int threads;
  double bytes_per_elem;
  int steps;
  std::function<void()> step;
  std::vector<double> round_medians;
};

}  // namespace

int main(int argc, char** argv) {
  // LibTorch's default, read before anything sets a thread count (what a user gets).
  const int torch_default_threads = at::get_num_threads();
  const Options opt = parse(argc, argv);
  const ops::SimdLevel best = ops::detect_simd_level();
  std::printf("INFO cpu_adam_bench: sizes=");
  for (auto s : opt.sizes_millions) std::printf("%lldM ", static_cast<long long>(s));
  std::printf("rounds=%d steps=%d warmup=%d torch_steps=%d threads(ours,fused,triad)=%d "
              "torch_default_threads=%d best_path=%s\n",
              opt.rounds, opt.steps, opt.warmup, opt.torch_steps, opt.threads,
              torch_default_threads, ops::simd_level_name(best));

  for (int64_t millions : opt.sizes_millions) {
    const int64_t n = millions * 1000000;
    FloatBuffer param(n), grad(n), exp_avg(n), exp_avg_sq(n), triad_a(n), triad_b(n), triad_c(n);
    std::vector<uint16_t> bf16_copy(static_cast<size_t>(n));
    // First touch with the benchmark's threads, so that no variant pays the page faults.
    omp_set_num_threads(opt.threads);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      param.get()[i] = 1e-3f * static_cast<float>(i % 2001 - 1000);
      grad.get()[i] = 1e-4f * static_cast<float>(i % 1999 - 999);
      exp_avg.get()[i] = 0.0f;
      exp_avg_sq.get()[i] = 0.0f;
      triad_a.get()[i] = 0.0f;
      triad_b.get()[i] = 1.0f;
      triad_c.get()[i] = 2.0f;
    }

    // Adam with DeepSpeed's defaults (weight_decay 0, where AdamW and Adam coincide), so that
    // torch::optim::Adam computes the same update as ours and the fused loop.
    int64_t ours_step = 0, fused_step = 0;
    ops::AdamStep adam;
    FusedAdamwStep fused{adam.lr, adam.beta1, adam.beta2, adam.eps, 0.0f, 0};

    // torch state lives in separate tensors; the parameter and gradient wrap the same memory.
    auto torch_param = torch::from_blob(param.get(), {n}, torch::kFloat32);
    torch_param.set_requires_grad(true);
    torch_param.mutable_grad() = torch::from_blob(grad.get(), {n}, torch::kFloat32);
    torch::optim::Adam torch_adam({torch_param}, torch::optim::AdamOptions(adam.lr));

    std::vector<Variant> variants;
    variants.push_back({"triad", opt.threads, 12.0, opt.steps, [&] {
                          deepspeed::bench::stream_triad(triad_a.get(), triad_b.get(),
                                                         triad_c.get(), 3.0f, n);
                        }});
    variants.push_back({"fused_loop", opt.threads, 28.0, opt.steps, [&] {
                          fused.step = ++fused_step;
                          deepspeed::bench::fused_adamw_loop(fused, param.get(), grad.get(),
                                                             exp_avg.get(), exp_avg_sq.get(), n);
                        }});
    for (ops::SimdLevel level : {ops::SimdLevel::kScalar, ops::SimdLevel::kAvx2,
                                 ops::SimdLevel::kAvx512}) {
      if (level > best) continue;
      // The scalar path is ~10x slower (a correctness fallback): as few steps as torch.
      const int steps = level == ops::SimdLevel::kScalar ? opt.torch_steps : opt.steps;
      variants.push_back({std::string("cpu_adam_") + ops::simd_level_name(level), opt.threads,
                          28.0, steps, [&, level] {
                            adam.step = ++ours_step;
                            ops::adam_update(adam, param.get(), grad.get(), exp_avg.get(),
                                             exp_avg_sq.get(), n, {}, level);
                          }});
    }
    // Ours with the bf16 copy of the updated parameters in the same pass (30 B/element).
    variants.push_back({std::string("cpu_adam_") + ops::simd_level_name(best) + "_bf16copy",
                        opt.threads, 30.0, opt.steps, [&] {
                          adam.step = ++ours_step;
                          ops::adam_update(adam, param.get(), grad.get(), exp_avg.get(),
                                           exp_avg_sq.get(), n,
                                           {bf16_copy.data(), ops::HalfKind::kBF16}, best);
                        }});
    // A ZeRO-Offload step with a clip/unscale coefficient: as its own pass over the gradients
    // (grad.mul_, then the update: +8 B/element) or in the update (AdamStep::grad_scale, the
    // engine's path). The coefficient alternates 0.5 and 2 so that the gradients do not drift.
    at::Tensor grad_tensor = torch_param.grad();
    float clip_coef = 0.5f;
    const std::string clip =
        std::string("cpu_adam_") + ops::simd_level_name(best) + "_bf16copy_clip";
    variants.push_back({clip + "_pass", opt.threads, 38.0, opt.steps, [&] {
                          clip_coef = clip_coef == 0.5f ? 2.0f : 0.5f;
                          grad_tensor.mul_(clip_coef);
                          adam.step = ++ours_step;
                          ops::adam_update(adam, param.get(), grad.get(), exp_avg.get(),
                                           exp_avg_sq.get(), n,
                                           {bf16_copy.data(), ops::HalfKind::kBF16}, best);
                        }});
    variants.push_back({clip + "_fused", opt.threads, 30.0, opt.steps, [&] {
                          ops::AdamStep clipped = adam;
                          clipped.grad_scale = 0.5f;
                          clipped.step = ++ours_step;
                          ops::adam_update(clipped, param.get(), grad.get(), exp_avg.get(),
                                           exp_avg_sq.get(), n,
                                           {bf16_copy.data(), ops::HalfKind::kBF16}, best);
                        }});
    // LibTorch's default (1 on some VMs, where cpuinfo misdetects the cores), 1 thread, and the
    // same threads as ours, so that the comparison with both cores on each side is also there.
    std::vector<int> torch_threads = {torch_default_threads};
    for (int t : {1, opt.threads}) {
      if (std::find(torch_threads.begin(), torch_threads.end(), t) == torch_threads.end()) {
        torch_threads.push_back(t);
      }
    }
    for (int t : torch_threads) {
      variants.push_back({"torch_cpp_adam_t" + std::to_string(t), t, 28.0, opt.torch_steps,
                          [&] { torch_adam.step(); }});
    }

    for (int round = 0; round < opt.rounds; ++round) {
      for (Variant& v : variants) {
        // at::set_num_threads also sets OpenMP's count (LibTorch shares libgomp with us).
        at::set_num_threads(v.threads);
        omp_set_num_threads(v.threads);
        for (int w = 0; w < opt.warmup; ++w) v.step();
        std::vector<double> times;
        for (int s = 0; s < v.steps; ++s) {
          const auto t0 = std::chrono::steady_clock::now();
          v.step();
          const auto t1 = std::chrono::steady_clock::now();
          times.push_back(std::chrono::duration<double>(t1 - t0).count());
        }
        v.round_medians.push_back(median(times));
        std::printf("ROUND %s.n%lldM round=%d median=%.6f\n", v.name.c_str(),
                    static_cast<long long>(millions), round, v.round_medians.back());
        std::fflush(stdout);
      }
    }
    for (const Variant& v : variants) {
      std::printf("RESULT %s.n%lldM median=%.6f min=%.6f max=%.6f n=%zu unit=s/step threads=%d "
                  "bytes_per_elem=%g elems=%lld\n",
                  v.name.c_str(), static_cast<long long>(millions), median(v.round_medians),
                  *std::min_element(v.round_medians.begin(), v.round_medians.end()),
                  *std::max_element(v.round_medians.begin(), v.round_medians.end()),
                  v.round_medians.size(), v.threads, v.bytes_per_elem,
                  static_cast<long long>(n));
    }
    std::fflush(stdout);
  }
  return 0;
}
