// Collective fingerprints (src/comm/collective_fingerprint.h): ranks that issue different
// collectives (sizes, kinds, roots, dtypes, reduce ops) get a CommError naming the collective,
// its sequence number and every rank's call, instead of Gloo aborting or mixing data; nothing
// was sent, so matching collectives work afterwards.
#include "deepspeed/comm.h"

#include <string>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "support/multi_rank.h"

namespace deepspeed {
namespace {

using testing::run_ranks;

// Runs `issue` and returns the CommError's text ("" when nothing was thrown).
template <typename Fn>
std::string comm_error_of(Fn&& issue) {
  try {
    issue();
  } catch (const CommError& e) {
    return e.what();
  }
  return "";
}

void expect_has(const std::string& message, const std::string& part) {
  EXPECT_NE(message.find(part), std::string::npos) << "missing: " << part << "\nin: " << message;
}

// After a refused collective the ranks still agree: a matching all-reduce is exact.
void expect_matching_all_reduce_works(int world) {
  auto t = torch::ones({5});
  comm::all_reduce(t);
  EXPECT_TRUE(torch::equal(t, torch::full({5}, static_cast<float>(world))));
}

TEST(CollectiveFingerprintDist, AllReduceOfDifferentSizesNamesBothRanks) {
  run_ranks(2, [](int rank, int world) {
    auto t = torch::ones({rank == 0 ? 10 : 20});
    const std::string message = comm_error_of([&] { comm::all_reduce(t); });
    expect_has(message, "[rank " + std::to_string(rank) +
                            "/2] the ranks issued different collectives");
    expect_has(message, "rank 0: #1 all_reduce (10 x float, op sum, phase other)");
    expect_has(message, "rank 1: #1 all_reduce (20 x float, op sum, phase other)");
    expect_has(message, "same element count, dtype, root and reduce op");
    EXPECT_EQ(message.find("gloo"), std::string::npos) << message;
    EXPECT_TRUE(torch::equal(t, torch::ones({rank == 0 ? 10 : 20})));  // nothing was reduced
    expect_matching_all_reduce_works(world);
  });
}

TEST(CollectiveFingerprintDist, DifferentKindsRootsDtypesAndOpsAreRefused) {
  run_ranks(2, [](int rank, int world) {
    auto t = torch::ones({8});
    // all_reduce on rank 0, broadcast on rank 1.
    std::string message = comm_error_of([&] {
      if (rank == 0) comm::all_reduce(t);
      else comm::broadcast(t, 0);
    });
    expect_has(message, "rank 0: #1 all_reduce (8 x float, op sum");
    expect_has(message, "rank 1: #1 broadcast (8 x float, root rank 0");
    // Each rank broadcasts from itself.
    message = comm_error_of([&] { comm::broadcast(t, rank); });
    expect_has(message, "rank 0: #2 broadcast (8 x float, root rank 0");
    expect_has(message, "rank 1: #2 broadcast (8 x float, root rank 1");
    // float on one rank, double on the other.
    auto d = rank == 0 ? torch::ones({8}) : torch::ones({8}, torch::kDouble);
    message = comm_error_of([&] { comm::all_reduce(d); });
    expect_has(message, "rank 1: #3 all_reduce (8 x double, op sum");
    // sum against max.
    message = comm_error_of(
        [&] { comm::all_reduce(t, rank == 0 ? comm::ReduceOp::kSum : comm::ReduceOp::kMax); });
    expect_has(message, "rank 0: #4 all_reduce (8 x float, op sum");
    expect_has(message, "rank 1: #4 all_reduce (8 x float, op max");
    expect_matching_all_reduce_works(world);
  });
}

}  // namespace
}  // namespace deepspeed
