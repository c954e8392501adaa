// FlopsProfiler on small modules: DeepSpeed's per-operator formulas (Linear, Conv2d, matmul,
// activations), top-level-only counting, attribution with and without ModuleScope, the report,
// and the lifecycle (threads, stop, output_file).
#include "deepspeed/profiler.h"

#include <fstream>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "support/expect_throw.h"
#include "support/temp_dir.h"

namespace deepspeed::profiling {
namespace {

template <typename M>
std::shared_ptr<torch::nn::Module> as_module(M holder) {
  return holder.ptr();
}

TEST(FlopsProfiler, LinearIsTwoTimesBatchInOutPlusBias) {
  torch::NoGradGuard no_grad;
  torch::nn::Linear linear(64, 32);
  FlopsProfiler prof(as_module(linear));
  auto x = torch::randn({8, 64});
  prof.start_profile();
  linear(x);
  prof.stop_profile();
  // B * in * out MACs, 2 flops each, plus one add per output element for the bias.
  EXPECT_EQ(prof.get_total_macs(), 8 * 64 * 32);
  EXPECT_EQ(prof.get_total_flops(), 2 * 8 * 64 * 32 + 8 * 32);
  EXPECT_EQ(prof.get_total_params(), 64 * 32 + 32);
  // The C++ Linear calls t(weight) and addmm; addmm's own internals are not counted again.
  const auto ops = prof.op_profiles();
  EXPECT_EQ(ops.at("aten::addmm").calls, 1);
  EXPECT_EQ(ops.at("aten::addmm").flops, prof.get_total_flops());
  EXPECT_EQ(ops.at("aten::t").flops, 0);
  EXPECT_EQ(ops.count("aten::mm"), 0u);
  EXPECT_EQ(ops.size(), 2u);
}

TEST(FlopsProfiler, FunctionalLinearCountsTheSame) {
  torch::NoGradGuard no_grad;
  torch::nn::Linear holder(1, 1);
  FlopsProfiler prof(as_module(holder));
  auto x = torch::randn({8, 64}), w = torch::randn({32, 64}), b = torch::randn({32});
  prof.start_profile();
  torch::linear(x, w, b);  // aten::linear itself
  torch::linear(x, w);
  prof.stop_profile();
  EXPECT_EQ(prof.op_profiles().at("aten::linear").flops,
            (2 * 8 * 64 * 32 + 8 * 32) + 2 * 8 * 64 * 32);
}

TEST(FlopsProfiler, LinearOnThreeDimInputCountsEveryRow) {
  torch::NoGradGuard no_grad;
  torch::nn::Linear linear(16, 24);
  FlopsProfiler prof(as_module(linear));
  prof.start_profile();
  linear(torch::randn({4, 5, 16}));  // t, matmul, add_ (bias)
  prof.stop_profile();
  EXPECT_EQ(prof.get_total_flops(), 2 * 4 * 5 * 16 * 24 + 4 * 5 * 24);
  EXPECT_EQ(prof.module_profile("").macs, 4 * 5 * 16 * 24);
}

TEST(FlopsProfiler, Conv2dCountsKernelVolumeTimesOutputPlusBias) {
  torch::NoGradGuard no_grad;
  torch::nn::Conv2d conv(torch::nn::Conv2dOptions(3, 8, 3).padding(1));
  FlopsProfiler prof(as_module(conv));
  prof.start_profile();
  conv(torch::randn({2, 3, 16, 16}));
  prof.stop_profile();
  const int64_t out = 2 * 8 * 16 * 16;
  EXPECT_EQ(prof.get_total_macs(), out * 3 * 3 * 3);
  EXPECT_EQ(prof.get_total_flops(), 2 * out * 27 + out);
}

// A two-layer block with a residual: model code between its Linear calls.
struct ResidualMlpImpl : torch::nn::Module {
  explicit ResidualMlpImpl(int64_t d, bool scoped) : scoped_(scoped) {
    fc1 = register_module("fc1", torch::nn::Linear(d, 4 * d));
    fc2 = register_module("fc2", torch::nn::Linear(4 * d, d));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    std::optional<ModuleScope> scope;
    if (scoped_) scope.emplace(*this);
    auto h = torch::relu(fc1(x));
    return x + fc2(h);
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  bool scoped_;
};
TORCH_MODULE(ResidualMlp);

struct TwoBlocksImpl : torch::nn::Module {
  explicit TwoBlocksImpl(int64_t d, bool scoped) {
    a = register_module("a", ResidualMlp(d, scoped));
    b = register_module("b", ResidualMlp(d, scoped));
  }
  torch::Tensor forward(const torch::Tensor& x) { return torch::softmax(b(a(x)), -1); }
  ResidualMlp a{nullptr}, b{nullptr};
};
TORCH_MODULE(TwoBlocks);

int64_t fc1_flops(int64_t rows, int64_t d) { return 2 * rows * d * 4 * d + rows * 4 * d; }
int64_t fc2_flops(int64_t rows, int64_t d) { return 2 * rows * 4 * d * d + rows * d; }
int64_t block_flops(int64_t rows, int64_t d, bool with_residual) {
  return fc1_flops(rows, d) + fc2_flops(rows, d) + rows * 4 * d /* relu */ +
         (with_residual ? rows * d : 0);
}

TEST(FlopsProfiler, AttributionWithoutScopesIsExactAtTheTopAndALowerBoundBelow) {
  torch::NoGradGuard no_grad;
  const int64_t rows = 6, d = 8;
  TwoBlocks model(d, /*scoped=*/false);
  FlopsProfiler prof(as_module(model));
  prof.start_profile();
  model(torch::randn({rows, d}));
  prof.stop_profile();
  const int64_t total = 2 * block_flops(rows, d, true) + rows * d /* softmax */;
  EXPECT_EQ(prof.get_total_flops(), total);
  EXPECT_EQ(prof.module_profile("").flops, total);
  // relu sits between a.fc1 and a.fc2: their common ancestor is a.
  // a's residual add comes after a.fc2 and before b.fc1: only the root certainly contains it.
  EXPECT_EQ(prof.module_profile("a").flops, block_flops(rows, d, false));
  EXPECT_EQ(prof.module_profile("a.fc1").flops, fc1_flops(rows, d));
  EXPECT_EQ(prof.module_profile("b.fc2").flops, fc2_flops(rows, d));
  EXPECT_EQ(prof.module_profile("a.fc1").params, d * 4 * d + 4 * d);
  EXPECT_EQ(prof.module_profile("a").params, 2 * (d * 4 * d) + 4 * d + d);
}

TEST(FlopsProfiler, ModuleScopeMakesAttributionExact) {
  torch::NoGradGuard no_grad;
  const int64_t rows = 6, d = 8;
  TwoBlocks model(d, /*scoped=*/true);
  FlopsProfiler prof(as_module(model));
  prof.start_profile();
  model(torch::randn({rows, d}));
  prof.stop_profile();
  EXPECT_EQ(prof.module_profile("a").flops, block_flops(rows, d, true));
  EXPECT_EQ(prof.module_profile("b").flops, block_flops(rows, d, true));
  EXPECT_EQ(prof.module_profile("").flops, 2 * block_flops(rows, d, true) + rows * d);
  const double a_latency = prof.module_profile("a").latency_s;
  EXPECT_GT(a_latency, 0.0);
  EXPECT_LE(a_latency, prof.module_profile("").latency_s);
}

TEST(FlopsProfiler, MatmulSoftmaxAndElementwiseFormulas) {
  torch::NoGradGuard no_grad;
  torch::nn::Linear holder(1, 1);  // any module: the ops below are model code of the root
  FlopsProfiler prof(as_module(holder));
  auto q = torch::randn({2, 3, 5, 4}), k = torch::randn({2, 3, 4, 7});
  prof.start_profile();
  auto s = torch::matmul(q, k);  // [2,3,5,7], K = 4
  auto p = torch::softmax(s * 0.5, -1);
  auto g = torch::gelu(p);
  auto e = torch::einsum("bhij,bhjk->bhik", {p, torch::randn({2, 3, 7, 6})});
  prof.stop_profile();
  const auto ops = prof.op_profiles();
  EXPECT_EQ(ops.at("aten::matmul").macs, 2 * 3 * 5 * 7 * 4);
  EXPECT_EQ(ops.at("aten::matmul").flops, 2 * 2 * 3 * 5 * 7 * 4);
  EXPECT_EQ(ops.at("aten::mul").flops, 2 * 3 * 5 * 7);
  EXPECT_EQ(ops.at("aten::softmax").flops, 2 * 3 * 5 * 7);
  EXPECT_EQ(ops.at("aten::gelu").flops, 2 * 3 * 5 * 7);
  // einsum is costed through the batched matmul it lowers to: [2*3, 5, 7] x [2*3, 7, 6].
  EXPECT_EQ(ops.at("aten::bmm").macs, 2 * 3 * 5 * 6 * 7);
  EXPECT_EQ(ops.count("aten::randn") + ops.count("aten::einsum"), 2u);  // recorded, cost 0
  EXPECT_EQ(ops.at("aten::einsum").flops, 0);
}

TEST(FlopsProfiler, OnlyTheStartingThreadIsRecorded) {
  torch::NoGradGuard no_grad;
  torch::nn::Linear linear(4, 4);
  FlopsProfiler prof(as_module(linear));
  prof.start_profile();
  std::thread other([&] { linear(torch::randn({2, 4})); });
  other.join();
  EXPECT_EQ(prof.get_total_flops(), 0);
  linear(torch::randn({2, 4}));
  prof.stop_profile();
  linear(torch::randn({2, 4}));  // after stop: not counted
  EXPECT_EQ(prof.get_total_flops(), 2 * 2 * 4 * 4 + 2 * 4);
}

TEST(FlopsProfiler, StartResetsAndTwoProfilesCannotOverlap) {
  torch::NoGradGuard no_grad;
  torch::nn::Linear linear(4, 4);
  FlopsProfiler prof(as_module(linear)), other(as_module(linear));
  prof.start_profile();
  linear(torch::randn({2, 4}));
  EXPECT_THROW_WITH(other.start_profile(), UsageError, "another profile records on this thread");
  prof.stop_profile();
  prof.start_profile();  // DeepSpeed's start_profile resets the counts
  prof.stop_profile();
  EXPECT_EQ(prof.get_total_flops(), 0);
  prof.end_profile();
  EXPECT_THROW_WITH(prof.model_profile_string(1, {}, -1, 1, true), UsageError,
                    "before start_profile");
}

TEST(FlopsProfiler, ReportHasDeepSpeedSectionsAndWritesOutputFile) {
  torch::NoGradGuard no_grad;
  testing::TempDir dir;
  TwoBlocks model(8, true);
  FlopsProfilerConfig config;
  config.output_file = dir.file("profile.txt");
  config.top_modules = 2;
  FlopsProfiler prof(as_module(model), config);
  prof.start_profile();
  model(torch::randn({6, 8}));
  prof.stop_profile();
  ProfileContext ctx;
  ctx.world_size = 2;
  ctx.dp_world_size = 2;
  ctx.train_micro_batch_size_per_gpu = 6;
  ctx.bwd_latency_s = 0.002;
  ctx.step_latency_s = 0.001;
  prof.print_model_profile(3, ctx);
  std::ifstream in(config.output_file);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  for (const char* expected :
       {"-------------------------- DeepSpeed Flops Profiler --------------------------",
        "Profile Summary at step 3:", "world size: ", "batch size per GPU: ", "params per GPU: ",
        "fwd MACs per GPU: ", "fwd flops per GPU: ", "bwd latency: ",
        "bwd FLOPS per GPU = 2 * fwd flops per GPU / bwd latency: ",
        "FLOPS per GPU = 3 * fwd flops per GPU / iter latency: ", "samples/second: ",
        "Aggregated Profile per GPU", "depth 1:\n    params      - {'ResidualMlp': ",
        "depth 2:\n    params      - {'Linear': ", "Detailed Profile per GPU", "TwoBlocks(\n  ",
        "\n  (a): ResidualMlp(\n    ", "\n    (fc1): Linear(",
        "in_features=8, out_features=32, bias=true)"}) {
    EXPECT_NE(text.find(expected), std::string::npos) << expected << "\n" << text;
  }
  char fwd_line[128];
  std::snprintf(fwd_line, sizeof fwd_line, "%-70s %s", "fwd MACs per GPU: ", "");
  EXPECT_NE(text.find(fwd_line), std::string::npos) << text;
}

TEST(FlopsProfiler, GetModelProfileRunsWarmUpThenProfilesOnce) {
  torch::NoGradGuard no_grad;
  torch::nn::Linear linear(10, 20);
  int calls = 0;
  ModelProfileOptions o;
  o.print_profile = false;
  o.warm_up = 2;
  auto p = get_model_profile(
      linear.ptr(),
      [&] {
        ++calls;
        linear(torch::randn({3, 10}));
      },
      o);
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(p.flops, 2 * 3 * 10 * 20 + 3 * 20);
  EXPECT_EQ(p.macs, 3 * 10 * 20);
  EXPECT_EQ(p.params, 220);
  EXPECT_NE(p.report.find("Profile Summary at step 2:"), std::string::npos);
  EXPECT_FALSE(linear->is_training());
}

}  // namespace
}  // namespace deepspeed::profiling
