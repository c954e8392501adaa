// Comms logger in one process: DeepSpeed's bandwidth formulas, size and mean helpers, and the
// records of collectives on a world of one (latency measured at wait() for async ops).
#include "comm/comms_logger.h"

#include <chrono>
#include <thread>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deepspeed/comm.h"
#include "deepspeed/comms_logging.h"

namespace deepspeed::comm {
namespace {

using detail::calc_bw_log;

TEST(CommsLoggerFormulas, BandwidthPerOpAsDeepSpeed) {
  // 1e6 bytes in 1 ms on 4 ranks: S/t = 8 Gbps.
  auto ar = calc_bw_log("all_reduce", 1000000, 1.0, 4);
  EXPECT_DOUBLE_EQ(ar.algbw_gbps, 16.0);                     // 2 S / t
  EXPECT_DOUBLE_EQ(ar.busbw_gbps, 12.0);                     // S / t * 2 (n-1) / n
  auto ag = calc_bw_log("all_gather", 1000000, 1.0, 4);      // one rank's share
  EXPECT_DOUBLE_EQ(ag.algbw_gbps, 32.0);                     // n S / t
  EXPECT_DOUBLE_EQ(ag.busbw_gbps, 24.0);                     // n S / t * (n-1) / n
  auto rs = calc_bw_log("reduce_scatter", 4000000, 1.0, 4);  // all four shares
  EXPECT_DOUBLE_EQ(rs.algbw_gbps, 32.0);
  EXPECT_DOUBLE_EQ(rs.busbw_gbps, 24.0);
  auto a2a = calc_bw_log("all_to_all_single", 1000000, 1.0, 4);
  EXPECT_DOUBLE_EQ(a2a.algbw_gbps, 8.0);
  EXPECT_DOUBLE_EQ(a2a.busbw_gbps, 6.0);
  for (const char* op : {"broadcast", "reduce", "send", "recv", "gather", "scatter"}) {
    auto b = calc_bw_log(op, 1000000, 2.0, 4);
    EXPECT_DOUBLE_EQ(b.algbw_gbps, 4.0) << op;
    EXPECT_DOUBLE_EQ(b.busbw_gbps, 4.0) << op;
  }
  EXPECT_DOUBLE_EQ(calc_bw_log("barrier", 0, 1.0, 4).algbw_gbps, 0.0);
  EXPECT_DOUBLE_EQ(calc_bw_log("all_reduce", 1000, 1.0, 1).busbw_gbps, 0.0);  // n = 1: no bus
}

TEST(CommsLoggerFormulas, ConvertSizeMatchesPython) {
  EXPECT_EQ(detail::convert_size(0), "0B");
  EXPECT_EQ(detail::convert_size(4), "4.0 B");
  EXPECT_EQ(detail::convert_size(1000), "1000.0 B");
  EXPECT_EQ(detail::convert_size(1024), "1.0 KB");
  EXPECT_EQ(detail::convert_size(4000), "3.91 KB");
  EXPECT_EQ(detail::convert_size(16388), "16.0 KB");
  EXPECT_EQ(detail::convert_size(1536 * 1024), "1.5 MB");
  EXPECT_EQ(detail::convert_size(1023 * 1024), "1023.0 KB");
  EXPECT_EQ(detail::convert_size(3221237817LL), "3.0 GB");
}

TEST(CommsLoggerFormulas, TrimMeanDropsTenPercentEachEnd) {
  EXPECT_DOUBLE_EQ(detail::trim_mean({}, 0.1), 0.0);
  EXPECT_DOUBLE_EQ(detail::trim_mean({10, 1, 2, 3, 4, 5, 6, 7, 8, 9}, 0.1), 5.5);  // k = 1
  EXPECT_DOUBLE_EQ(detail::trim_mean({1, 2, 3, 4, 100}, 0.1), 22.0);               // round(0.5) = 0
  std::vector<double> fifteen;
  for (int i = 1; i <= 15; ++i) fifteen.push_back(i);
  fifteen.back() = 1000;  // k = round(1.5) = 2 drops it
  EXPECT_DOUBLE_EQ(detail::trim_mean(fifteen, 0.1), 8.0);
}

class CommsLoggerSingleRank : public ::testing::Test {
 protected:
  void SetUp() override {
    init_distributed();
    CommsLoggerConfig c;
    c.enabled = true;
    configure_comms_logger(c);
    reset_comms_log();
  }
  void TearDown() override {
    configure_comms_logger(CommsLoggerConfig{});
    reset_comms_log();
  }
};

TEST_F(CommsLoggerSingleRank, RecordsEachCollectiveBySize) {
  auto a = torch::ones({100});
  all_reduce(a);
  all_reduce(a);
  auto d = torch::ones({3}, torch::kDouble);
  all_reduce(d);
  auto out = torch::empty({100});
  all_gather(out, a);
  barrier();
  const auto entries = comms_log_entries();
  ASSERT_EQ(entries.size(), 4u);
  EXPECT_EQ(entries[0].record_name, "all_reduce");
  EXPECT_EQ(entries[0].msg_size_bytes, 24);  // sizes ascending within an op
  EXPECT_EQ(entries[0].count, 1);
  EXPECT_EQ(entries[1].record_name, "all_reduce");
  EXPECT_EQ(entries[1].msg_size_bytes, 400);
  EXPECT_EQ(entries[1].count, 2);
  EXPECT_EQ(entries[1].latencies_ms.size(), 2u);
  EXPECT_EQ(entries[2].record_name, "all_gather");
  EXPECT_EQ(entries[3].record_name, "barrier");
  EXPECT_EQ(entries[3].msg_size_bytes, 0);
}

TEST_F(CommsLoggerSingleRank, AsyncLatencyRunsToWait) {
  auto a = torch::ones({10});
  Handle h = all_reduce(a, ReduceOp::kSum, /*async_op=*/true);
  EXPECT_TRUE(comms_log_entries().empty());  // recorded at completion
  std::this_thread::sleep_for(std::chrono::milliseconds(60));
  h.wait();
  h.wait();  // a second wait records nothing more
  const auto entries = comms_log_entries();
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0].count, 1);
  EXPECT_GE(entries[0].latencies_ms[0], 60.0);
}

TEST_F(CommsLoggerSingleRank, DisabledRecordsNothing) {
  configure_comms_logger(CommsLoggerConfig{});
  auto a = torch::ones({10});
  all_reduce(a);
  EXPECT_TRUE(comms_log_entries().empty());
}

TEST_F(CommsLoggerSingleRank, ProfOpsSelectsOpsWhenProfAllIsOff) {
  CommsLoggerConfig c;
  c.enabled = true;
  c.prof_all = false;
  c.prof_ops = {"broadcast"};
  configure_comms_logger(c);
  auto a = torch::ones({10});
  all_reduce(a);
  broadcast(a, 0);
  const auto entries = comms_log_entries();
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0].record_name, "broadcast");
}

TEST_F(CommsLoggerSingleRank, DebugNamesThePhase) {
  CommsLoggerConfig c;
  c.enabled = true;
  c.debug = true;
  configure_comms_logger(c);
  auto a = torch::ones({10});
  {
    PhaseScope phase(Phase::kBackward);
    all_reduce(a);
  }
  const auto entries = comms_log_entries();
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0].record_name, "all_reduce | [Caller Func: backward]");
}

TEST_F(CommsLoggerSingleRank, SummaryTableHasDeepSpeedColumns) {
  auto a = torch::ones({4097});
  for (int i = 0; i < 3; ++i) all_reduce(a);
  const std::string table = comms_log_summary_string();
  EXPECT_EQ(table.rfind("Comm. Op            Message Size        Count               "
                        "Total Latency(ms)   Avg Latency(ms)     tput_avg (Gbps)     "
                        "busbw_avg (Gbps)    \n",
                        0),
            0u)
      << table;
  EXPECT_NE(
      table.find("\nall_reduce\n                    16.0 KB             3                   "),
      std::string::npos)
      << table;
}

}  // namespace
}  // namespace deepspeed::comm
