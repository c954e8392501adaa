// comm::all_to_all_single on 2, 3 and 4 ranks (float, uint8, bf16, sub-groups), its size checks,
// with split sizes (zero rows among them), and the sent-byte accounting of every collective
// (Note [Sent bytes]).
#include "deepspeed/comm.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "support/expect_throw.h"
#include "support/multi_rank.h"

namespace deepspeed {
namespace {

using testing::run_ranks;

// Slice r of rank s's input is (1000 * s + 100 * r + i); rank r must receive, in slice s,
// exactly what rank s addressed to it.
void check_all_to_all(int rank, int world) {
  for (int64_t per : {int64_t{1}, int64_t{5}, int64_t{1031}}) {
    auto in = torch::empty({per * world});
    for (int r = 0; r < world; ++r) {
      in.narrow(0, r * per, per).copy_(torch::arange(per, torch::kFloat) + 1000.0f * rank + 100.0f * r);
    }
    auto out = torch::full({per * world}, -1.0f);
    comm::all_to_all_single(out, in);
    for (int s = 0; s < world; ++s) {
      EXPECT_TRUE(torch::equal(out.narrow(0, s * per, per),
                               torch::arange(per, torch::kFloat) + 1000.0f * s + 100.0f * rank))
          << "per " << per << " from rank " << s;
    }
    // Packed bits travel as uint8; bf16 as its 16-bit pattern.
    auto bytes_in = (in.remainder(251)).to(torch::kUInt8);
    auto bytes_out = torch::zeros_like(bytes_in);
    comm::all_to_all_single(bytes_out, bytes_in);
    EXPECT_TRUE(torch::equal(bytes_out, out.remainder(251).to(torch::kUInt8)));
    auto bf_in = in.to(torch::kBFloat16);
    auto bf_out = torch::zeros_like(bf_in);
    comm::all_to_all_single(bf_out, bf_in, /*async_op=*/true).wait();
    EXPECT_TRUE(torch::equal(bf_out, out.to(torch::kBFloat16)));
  }
  EXPECT_THROW_WITH(
      [&] {
        auto in = torch::zeros({world * 2 + 1});
        auto out = torch::zeros({world * 2 + 1});
        comm::all_to_all_single(out, in);
      }(),
      CommError, "not divisible by the group size");
  EXPECT_THROW_WITH(
      [&] {
        auto in = torch::zeros({world * 2});
        auto out = torch::zeros({world * 3});
        comm::all_to_all_single(out, in);
      }(),
      CommError, "all_to_all_single");
}

TEST(AllToAllDist, ExchangesSlicesOnTwoRanks) { run_ranks(2, check_all_to_all); }
TEST(AllToAllDist, ExchangesSlicesOnThreeRanks) { run_ranks(3, check_all_to_all); }
TEST(AllToAllDist, ExchangesSlicesOnFourRanks) { run_ranks(4, check_all_to_all); }

// Split sizes: rank s sends (s + r) % 3 rows of width 3 to rank r (zero rows included), each row
// (1000 s + 100 r + j); rank r receives them in source order. The sent bytes count the rows
// that leave the rank; a split list of the wrong length or sum is an error.
void check_split_all_to_all(int rank, int world) {
  std::vector<int64_t> in_splits, out_splits;
  std::vector<at::Tensor> rows, want;
  for (int r = 0; r < world; ++r) {
    in_splits.push_back((rank + r) % 3);
    out_splits.push_back((r + rank) % 3);
    for (int64_t j = 0; j < in_splits.back(); ++j) {
      rows.push_back(torch::full({1, 3}, 1000.0 * rank + 100.0 * r + j));
    }
    for (int64_t j = 0; j < out_splits.back(); ++j) {
      want.push_back(torch::full({1, 3}, 1000.0 * r + 100.0 * rank + j));
    }
  }
  const auto cat = [](const std::vector<at::Tensor>& v) {
    return v.empty() ? torch::zeros({0, 3}) : torch::cat(v);
  };
  const at::Tensor in = cat(rows), expected = cat(want);
  for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
    at::Tensor out = torch::full({expected.size(0), 3}, -1.0).to(dtype);
    const int64_t before = comm::bytes_sent();
    comm::all_to_all_single(out, in.to(dtype), out_splits, in_splits);
    EXPECT_TRUE(torch::equal(out, expected.to(dtype))) << dtype;
    const int64_t leaving = in.size(0) - in_splits[static_cast<size_t>(rank)];
    EXPECT_EQ(comm::bytes_sent() - before, leaving * 3 * out.element_size()) << dtype;
  }
  EXPECT_THROW_WITH(
      [&] {
        at::Tensor out = torch::zeros({expected.size(0), 3});
        std::vector<int64_t> short_list(in_splits.begin(), in_splits.end() - 1);
        comm::all_to_all_single(out, in, out_splits, short_list);
      }(),
      CommError, "input split sizes for a group of");
  EXPECT_THROW_WITH(
      [&] {
        at::Tensor out = torch::zeros({expected.size(0) + 1, 3});
        comm::all_to_all_single(out, in, out_splits, in_splits);
      }(),
      CommError, "split sizes sum to");
}

TEST(AllToAllDist, SplitSizesExchangeRowsOnThreeRanks) { run_ranks(3, check_split_all_to_all); }

TEST(AllToAllDist, RunsOnASubGroupInGroupRankOrder) {
  run_ranks(4, [](int rank, int) {
    // Group [3, 1]: group rank 0 is global rank 3.
    auto odd = comm::new_group({3, 1}, "odd");
    if (!odd.is_member()) return;
    const int me = odd.rank();
    auto in = torch::tensor({10.0f * me + 0, 10.0f * me + 1});
    auto out = torch::zeros({2});
    comm::all_to_all_single(out, in, false, odd);
    EXPECT_TRUE(torch::equal(out, torch::tensor({0.0f + me, 10.0f + me}))) << "rank " << rank;
  });
}

// Ranks that call all_to_all_single with different sizes get the collective check's error naming
// both calls, not a Gloo abort, and the group stays usable.
TEST(AllToAllDist, MismatchedSizesAreReportedByTheCollectiveCheck) {
  run_ranks(2, [](int rank, int) {
    const int64_t n = rank == 0 ? 4 : 8;
    auto in = torch::ones({n});
    auto out = torch::zeros({n});
    std::string message;
    try {
      comm::all_to_all_single(out, in);
    } catch (const CommError& e) {
      message = e.what();
    }
    EXPECT_NE(message.find("rank 0: #1 all_to_all_single (4 x float"), std::string::npos) << message;
    EXPECT_NE(message.find("rank 1: #1 all_to_all_single (8 x float"), std::string::npos) << message;
    auto ok_in = torch::full({4}, static_cast<float>(rank));
    auto ok_out = torch::zeros({4});
    comm::all_to_all_single(ok_out, ok_in);
    EXPECT_TRUE(torch::equal(ok_out, torch::tensor({0.0f, 0.0f, 1.0f, 1.0f})));
  });
}

// Each collective adds the bytes of Note [Sent bytes] to comm::bytes_sent().
void check_sent_bytes(int rank, int world) {
  const int64_t n = world;
  auto delta = [](auto&& fn) {
    const int64_t before = comm::bytes_sent();
    fn();
    return comm::bytes_sent() - before;
  };
  auto t = torch::zeros({12 * n});  // 48n bytes
  const int64_t s = 48 * n;
  EXPECT_EQ(delta([&] { comm::all_reduce(t); }), 2 * (n - 1) * s / n);
  auto share = torch::zeros({12});
  auto gathered = torch::zeros({12 * n});
  EXPECT_EQ(delta([&] { comm::all_gather(gathered, share); }), (n - 1) * 48);
  auto out = torch::zeros({12 * n});
  EXPECT_EQ(delta([&] { comm::all_to_all_single(out, t); }), (n - 1) * s / n);
  auto bits = torch::zeros({8 * n}, torch::kUInt8);
  auto bits_out = torch::zeros({8 * n}, torch::kUInt8);
  EXPECT_EQ(delta([&] { comm::all_to_all_single(bits_out, bits); }), (n - 1) * 8);
  EXPECT_EQ(delta([&] { comm::broadcast(t, 1); }), rank == 1 ? s : 0);
  EXPECT_EQ(delta([&] { comm::reduce(t, 0); }), rank == 0 ? 0 : s);
  auto self = comm::self_group("self");
  EXPECT_EQ(delta([&] { comm::all_reduce(t, comm::ReduceOp::kSum, false, self); }), 0);
}

TEST(AllToAllDist, CountsSentBytesPerCollectiveOnTwoRanks) { run_ranks(2, check_sent_bytes); }
TEST(AllToAllDist, CountsSentBytesPerCollectiveOnFourRanks) { run_ranks(4, check_sent_bytes); }

}  // namespace
}  // namespace deepspeed
