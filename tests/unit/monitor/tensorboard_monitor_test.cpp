// TensorBoardMonitor: file placement and name, and events read back with valid CRCs; then the
// same file through TensorBoard's own Python reader when the `tensorboard` package is importable.
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "deepspeed/monitor.h"
#include "monitor/event_file_format.h"
#include "support/expect_throw.h"
#include "support/run_command.h"
#include "support/temp_dir.h"

namespace deepspeed::monitor {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

MonitorConfig tb_config(const std::string& out, const std::string& job = "job1") {
  MonitorConfig c;
  c.enabled = true;
  c.output_path = out;
  c.job_name = job;
  return c;
}

std::vector<Event> sample_events() {
  return {{kTrainLoss, 10.8125, 0},
          {kLr, 0.001, 64},
          {kLossScale, 65536.0, 64},
          {kTrainLoss, 7.25, 64},
          {"Client/my metric", -3.5, 128}};
}

TEST(TensorBoardMonitor, WritesEventFileUnderOutputPathAndJobName) {
  TempDir dir;
  TensorBoardMonitor tb(tb_config(dir.path()));
  EXPECT_EQ(tb.log_dir(), dir.path() + "/job1");
  const std::string name = fs::path(tb.file_path()).filename().string();
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  // events.out.tfevents.<10-digit time>.<host>.<pid>.<n>
  ASSERT_EQ(name.rfind("events.out.tfevents.", 0), 0u) << name;
  EXPECT_NE(name.find(std::string(".") + host + "." + std::to_string(::getpid()) + "."),
            std::string::npos)
      << name;
  EXPECT_EQ(name.substr(20, 10).find_first_not_of("0123456789"), std::string::npos) << name;
  EXPECT_EQ(fs::path(tb.file_path()).parent_path().string(), dir.path() + "/job1");
}

TEST(TensorBoardMonitor, EventsRoundTripWithTagsStepsAndValues) {
  TempDir dir;
  std::string path;
  {
    TensorBoardMonitor tb(tb_config(dir.path()));
    path = tb.file_path();
    const auto events = sample_events();
    tb.write_events({events[0], events[1], events[2]});
    // Flushed per write_events: readable before the monitor closes.
    auto partial = detail::read_event_file(path);
    EXPECT_EQ(partial.size(), 4u);
    tb.write_events({events[3], events[4]});
  }
  const auto records = detail::read_event_file(path);  // checks every CRC
  ASSERT_EQ(records.size(), 6u);
  EXPECT_EQ(records[0].file_version, "brain.Event:2");
  EXPECT_TRUE(records[0].values.empty());
  const auto expected = sample_events();
  for (size_t i = 0; i < expected.size(); ++i) {
    const auto& r = records[i + 1];
    ASSERT_EQ(r.values.size(), 1u);
    EXPECT_EQ(r.values[0].tag, expected[i].name);
    EXPECT_EQ(r.values[0].simple_value, static_cast<float>(expected[i].value));
    EXPECT_EQ(r.step, expected[i].step);
    EXPECT_GT(r.wall_time, 1.6e9);  // seconds since the epoch
    EXPECT_GE(r.wall_time, records[0].wall_time);
  }
}

TEST(TensorBoardMonitor, TwoMonitorsInOneDirectoryGetDistinctFiles) {
  TempDir dir;
  TensorBoardMonitor a(tb_config(dir.path())), b(tb_config(dir.path()));
  EXPECT_NE(a.file_path(), b.file_path());
}

TEST(TensorBoardMonitor, UnwritableOutputPathNamesTheKey) {
  TempDir dir;
  testing::write_text_file(dir.file("file"), "x");
  EXPECT_THROW_WITH(TensorBoardMonitor(tb_config(dir.file("file"))), ConfigError,
                    "tensorboard.output_path");
}

// TensorBoard's own reader (tensorboard.backend.event_processing.event_file_loader) verifies
// the record CRCs and parses the Event protos with protobuf.
TEST(TensorBoardMonitor, PythonTensorBoardReadsTheFile) {
  if (testing::run_command("python3 -c 'import tensorboard' 2>/dev/null").exit_code != 0) {
    GTEST_SKIP() << "python3 cannot import tensorboard; the C++ reader tests cover the format";
  }
  TempDir dir;
  std::string path;
  {
    TensorBoardMonitor tb(tb_config(dir.path()));
    path = tb.file_path();
    tb.write_events(sample_events());
  }
  const std::string script = dir.file("read.py");
  testing::write_text_file(
      script,
      "import sys\n"
      "from tensorboard.backend.event_processing import event_file_loader\n"
      "for e in event_file_loader.RawEventFileLoader(sys.argv[1], "
      "detect_file_replacement=False).Load():\n"
      "    from tensorboard.compat.proto import event_pb2\n"
      "    ev = event_pb2.Event.FromString(e)\n"
      "    if ev.file_version: print('version', ev.file_version)\n"
      "    for v in ev.summary.value: print(v.tag, ev.step, repr(v.simple_value))\n");
  auto r = testing::run_command("python3 " + script + " " + path);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out,
            "version brain.Event:2\n"
            "Train/Samples/train_loss 0 10.8125\n"
            "Train/Samples/lr 64 0.0010000000474974513\n"
            "Train/Samples/loss_scale 64 65536.0\n"
            "Train/Samples/train_loss 64 7.25\n"
            "Client/my metric 128 -3.5\n")
      << r.err;
}

}  // namespace
}  // namespace deepspeed::monitor
