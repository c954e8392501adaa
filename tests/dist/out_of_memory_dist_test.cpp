// An allocation that fails inside the engine, for real: under a memory budget imposed on the
// process (RLIMIT_DATA, tests/support/memory_limit.h) a forward whose activation does not fit
// throws OutOfMemoryError carrying the rank, the phase, the allocator's text and the engine's
// memory ledger. One rank in a process of its own (the budget must not bound the test runner).
#include "deepspeed/deepspeed.h"

#include <string>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "support/memory_limit.h"
#include "support/multi_rank.h"

namespace deepspeed {
namespace {

using testing::run_ranks;

// The activation is an outer product: batch x 256 x 256 floats (256 KiB per sample). It comes
// first: OpenBLAS retries a failed allocation of its own forever, so no matrix product may be
// the one that meets the budget.
struct OuterProduct : torch::nn::Module {
  OuterProduct() { lin = register_module("lin", torch::nn::Linear(256, 256)); }
  torch::Tensor forward(const torch::Tensor& x) {
    auto pairs = (x.unsqueeze(2) * x.unsqueeze(1)).mean();
    return lin(x).pow(2).mean() + pairs;
  }
  torch::nn::Linear lin{nullptr};
};

void forward_past_the_budget(int, int) {
  // OpenBLAS maps its work buffer at the first matrix product: part of the baseline.
  torch::mm(torch::ones({64, 64}), torch::ones({64, 64}));
  json cfg = {{"train_micro_batch_size_per_gpu", 2},
              {"zero_optimization", {{"stage", 1}}},
              {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}}}}}};
  auto engine = initialize(std::make_shared<OuterProduct>(), cfg).engine;
  engine->backward(engine->forward(torch::randn({2, 256})));  // 512 KiB: fits
  engine->step();
  const auto big = torch::randn({256, 256});  // its activation needs 64 MiB
  testing::limit_data_memory(16 << 20);
  try {
    engine->forward(big);
    ADD_FAILURE() << "expected OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    const std::string what = e.what();
    std::printf("%s\n", what.c_str());
    EXPECT_NE(what.find("[rank 0/1] out of memory during forward: "), std::string::npos) << what;
    EXPECT_NE(what.find("allocat"), std::string::npos) << what;  // the allocator's own text
    // The ledger, with the optimizer states the first step created (2 x 4 x 65792 bytes).
    EXPECT_NE(what.find("memory at out-of-memory during forward (rank 0, ZeRO-1, offload none)"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("optimizer states 0.53 MB"), std::string::npos) << what;
    EXPECT_NE(what.find("RSS "), std::string::npos) << what;
  }
}

TEST(OutOfMemoryDist, ForwardPastTheBudgetThrowsOutOfMemoryErrorWithTheLedger) {
  run_ranks(1, forward_past_the_budget);
}

}  // namespace
}  // namespace deepspeed
