// Comms logger on 2 Gloo ranks: a known sequence of collectives gives known records (names,
// sizes, counts) on both ranks; verbose lines and the summary print on rank 0 only; the
// straggler summary all-reduces the latencies.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "comm/comms_logger.h"
#include "deepspeed/comm.h"
#include "deepspeed/comms_logging.h"
#include "support/multi_rank.h"

namespace deepspeed::comm {
namespace {

using testing::run_ranks;

void known_sequence(int rank, int world) {
  CommsLoggerConfig c;
  c.enabled = true;
  c.verbose = true;
  configure_comms_logger(c);
  auto big = torch::ones({4097});
  for (int i = 0; i < 3; ++i) all_reduce(big);  // 16388 B x 3
  auto small = torch::ones({10}, torch::kDouble);
  all_reduce(small);  // 80 B
  auto in = torch::full({100}, static_cast<float>(rank));
  auto gathered = torch::empty({100 * world});
  all_gather(gathered, in);  // 400 B (one rank's share)
  auto rs_in = torch::ones({100 * world});
  auto rs_out = torch::empty({100});
  reduce_scatter(rs_out, rs_in);  // 800 B (all shares)
  auto b = torch::zeros({8}, torch::kLong);
  broadcast(b, 1);  // 64 B
  auto x = torch::ones({1000}), y = torch::ones({1000});
  Handle hx = all_reduce(x, ReduceOp::kSum, true), hy = all_reduce(y, ReduceOp::kSum, true);
  hy.wait();
  hx.wait();  // 4000 B x 2
  barrier();  // 0 B

  struct Expected {
    const char* name;
    int64_t bytes;
    int64_t count;
  };
  const Expected expected[] = {{"all_reduce", 80, 1},      {"all_reduce", 4000, 2},
                               {"all_reduce", 16388, 3},   {"all_gather", 400, 1},
                               {"reduce_scatter", 800, 1}, {"broadcast", 64, 1},
                               {"barrier", 0, 1}};
  const auto entries = comms_log_entries();
  ASSERT_EQ(entries.size(), std::size(expected));
  for (size_t i = 0; i < entries.size(); ++i) {
    const auto& e = entries[i];
    EXPECT_EQ(e.record_name, expected[i].name) << i;
    EXPECT_EQ(e.msg_size_bytes, expected[i].bytes) << e.record_name;
    EXPECT_EQ(e.count, expected[i].count) << e.record_name;
    ASSERT_EQ(e.latencies_ms.size(), static_cast<size_t>(e.count));
    for (size_t k = 0; k < e.latencies_ms.size(); ++k) {
      EXPECT_GT(e.latencies_ms[k], 0.0);
      const auto bw =
          detail::calc_bw_log(e.record_name, e.msg_size_bytes, e.latencies_ms[k], world);
      EXPECT_DOUBLE_EQ(e.algbw_gbps[k], bw.algbw_gbps);
      EXPECT_DOUBLE_EQ(e.busbw_gbps[k], bw.busbw_gbps);
    }
  }
  // all_reduce on 2 ranks: busbw = algbw / 2 (2 (n-1) / n = 1 vs 2).
  EXPECT_DOUBLE_EQ(entries[2].busbw_gbps[0] * 2.0, entries[2].algbw_gbps[0]);
  log_summary(/*show_straggler=*/true);
  // The first log_summary barrier was recorded (under DeepSpeed's name) before the table.
  const auto after = comms_log_entries();
  EXPECT_EQ(after.back().record_name, "log_summary_barrier");
  EXPECT_EQ(after.back().count, 2);
}

TEST(CommsLoggerDist, KnownSequenceOnTwoRanks) {
  auto results = run_ranks(2, known_sequence);
  ASSERT_EQ(results.size(), 2u);
  const std::string& r0 = results[0].output;
  const std::string& r1 = results[1].output;
  EXPECT_NE(r0.find("comm op: all_reduce | time (ms): "), std::string::npos) << r0;
  EXPECT_NE(r0.find("| msg size: 16.0 KB | algbw (Gbps): "), std::string::npos) << r0;
  EXPECT_EQ(r1.find("comm op: "), std::string::npos) << r1;
  EXPECT_NE(r0.find("Comm. Op            Message Size"), std::string::npos) << r0;
  EXPECT_NE(r0.find("\nreduce_scatter\n                    800.0 B             1   "),
            std::string::npos)
      << r0;
  EXPECT_NE(r0.find("\nlog_summary_barrier\n                    0B                  1   "),
            std::string::npos)
      << r0;
  EXPECT_NE(r0.find("Breakdown with straggler effect"), std::string::npos) << r0;
  EXPECT_NE(r0.find("Total straggler(ms)"), std::string::npos) << r0;
  EXPECT_EQ(r1.find("Comm. Op"), std::string::npos) << r1;
}

}  // namespace
}  // namespace deepspeed::comm
