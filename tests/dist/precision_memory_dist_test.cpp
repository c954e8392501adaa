// The memory report (Engine::memory_stats) per precision and ZeRO stage on 2 Gloo ranks, after
// one optimizer step: the bytes per parameter of docs/precision.md ("Memory per parameter") and
// docs/zero.md. Elementwise model: Debian's LibTorch 1.13 has fp16 elementwise kernels on CPU
// but no fp16 matmul.
#include "deepspeed/deepspeed.h"

#include <cstdio>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "support/multi_rank.h"

namespace deepspeed {
namespace {

using testing::run_ranks;

// 35 + 37 + 1001 = 1073 parameters: odd, so every flat buffer is padded.
struct Elementwise : torch::nn::Module {
  Elementwise() {
    torch::manual_seed(11);
    for (auto shape : {std::vector<int64_t>{5, 7}, {37}, {1001}}) {
      params.push_back(register_parameter("p" + std::to_string(params.size()),
                                          torch::randn(shape) * 0.1));
    }
  }
  torch::Tensor forward(const std::vector<torch::Tensor>& xs) {
    torch::Tensor loss;
    for (size_t i = 0; i < params.size(); ++i) {
      auto term = (params[i] * xs[i] - 0.5).pow(2).mean();
      loss = loss.defined() ? loss + term : term;
    }
    return loss;
  }
  std::vector<torch::Tensor> params;
};

constexpr int64_t kPsi = 35 + 37 + 1001;

int64_t round_up(int64_t n, int64_t unit) { return (n + unit - 1) / unit * unit; }

// The formula, per rank, with Ψ parameters, W ranks, b = 2 (fp16/bf16) or 4 (fp32) bytes:
// each flat buffer is padded to P = Ψ rounded up to 2·W' elements, W' = 1 for stage 0 (one
// replicated partition) and W for stages 1-2. After the step (gradients of the model freed):
//   parameters       b·P            (stage 0 fp32: 4·Ψ, the model's own tensors, no flat buffer)
//   fp32 masters     4·P/W'         (16-bit only; fp32 steps the parameters themselves)
//   gradients        4·P/W'         (fp32 partitions: data_types.grad_accum_dtype unset)
//   Adam states      8·P/W'         (exp_avg + exp_avg_sq, fp32)
//   reduction buffer b·Ψ            (one bucket: reduce_bucket_size >= Ψ; communication dtype =
//                                    training dtype, overlap_comm false)
MemoryStats expected(int stage, at::ScalarType dtype, int world) {
  const int64_t b = dtype == at::kFloat ? 4 : 2;
  MemoryStats m;
  if (stage == 0 && dtype == at::kFloat) {
    m.param_bytes = 4 * kPsi;
    m.grad_bytes = 4 * kPsi;
    m.optimizer_state_bytes = 8 * kPsi;
    m.comm_buffer_bytes = 4 * kPsi;
    return m;
  }
  const int64_t partitions = stage == 0 ? 1 : world;
  const int64_t padded = round_up(kPsi, 2 * partitions);
  const int64_t owned = padded / partitions;
  m.param_bytes = b * padded;
  m.master_param_bytes = dtype == at::kFloat ? 0 : 4 * owned;
  m.grad_bytes = 4 * owned;
  m.optimizer_state_bytes = 8 * owned;
  m.comm_buffer_bytes = b * kPsi;
  m.padding_elements = padded - kPsi;
  return m;
}

TEST(PrecisionMemoryDist, BytesPerParameterFollowTheFormulaForEachDtypeAndStage) {
  run_ranks(2, [](int rank, int world) {
    for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
      for (int stage : {0, 1, 2}) {
        auto model = std::make_shared<Elementwise>();
        json cfg = {{"train_micro_batch_size_per_gpu", 1},
                    {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}}}}},
                    {"zero_optimization", {{"stage", stage}, {"reduce_bucket_size", 100000}}}};
        if (dtype == at::kBFloat16) cfg["bf16"] = {{"enabled", true}};
        // Dynamic scaling from 2^8: this model's scaled gradients stay far below fp16's max.
        if (dtype == at::kHalf) cfg["fp16"] = {{"enabled", true}, {"initial_scale_power", 8}};
        auto [engine, opt, sched] = initialize(model, cfg);
        std::vector<torch::Tensor> xs;
        for (auto& p : model->params) xs.push_back(torch::randn(p.sizes()).to(dtype) + rank);
        engine->backward(engine->forward_with([&] { return model->forward(xs); }));
        engine->step();
        const std::string what = std::string(c10::toString(dtype)) + " ZeRO-" +
                                 std::to_string(stage) + " rank " + std::to_string(rank);
        ASSERT_EQ(engine->skipped_steps(), 0) << what << ": Adam state needs an applied step";
        const MemoryStats got = engine->memory_stats(), want = expected(stage, dtype, world);
        EXPECT_EQ(got.param_bytes, want.param_bytes) << what;
        EXPECT_EQ(got.master_param_bytes, want.master_param_bytes) << what;
        EXPECT_EQ(got.grad_bytes, want.grad_bytes) << what;
        EXPECT_EQ(got.optimizer_state_bytes, want.optimizer_state_bytes) << what;
        EXPECT_EQ(got.comm_buffer_bytes, want.comm_buffer_bytes) << what;
        EXPECT_EQ(got.padding_elements, want.padding_elements) << what;
        if (rank == 0) {
          const double per_param = static_cast<double>(got.param_bytes + got.master_param_bytes +
                                                       got.grad_bytes + got.optimizer_state_bytes) /
                                   kPsi;
          std::printf("%s: %.2f bytes per parameter (params %lld, masters %lld, grads %lld, "
                      "Adam %lld, buckets %lld)\n",
                      what.c_str(), per_param, static_cast<long long>(got.param_bytes),
                      static_cast<long long>(got.master_param_bytes),
                      static_cast<long long>(got.grad_bytes),
                      static_cast<long long>(got.optimizer_state_bytes),
                      static_cast<long long>(got.comm_buffer_bytes));
        }
      }
    }
  });
}

}  // namespace
}  // namespace deepspeed
