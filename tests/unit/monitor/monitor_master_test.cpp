// MonitorMaster: which monitors exist on which rank, fan-out, and the refused monitors.
#include <filesystem>

#include <gtest/gtest.h>

#include "deepspeed/monitor.h"
#include "monitor/event_file_format.h"
#include "support/expect_throw.h"
#include "support/temp_dir.h"

namespace deepspeed::monitor {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

DeepSpeedConfig config_with(const json& extra) {
  json j = {{"train_batch_size", 4}};
  if (extra.is_object()) j.update(extra);
  return DeepSpeedConfig::from_json(j, 1);
}

TEST(MonitorMaster, FansOutToTensorBoardAndCsvOnRankZero) {
  TempDir dir;
  auto c = config_with(
      {{"tensorboard", {{"enabled", true}, {"output_path", dir.path()}, {"job_name", "tb"}}},
       {"csv_monitor", {{"enabled", true}, {"output_path", dir.path()}, {"job_name", "csv"}}}});
  MonitorMaster m(c, /*rank=*/0);
  ASSERT_TRUE(m.enabled());
  ASSERT_NE(m.tensorboard(), nullptr);
  ASSERT_NE(m.csv_monitor(), nullptr);
  m.write_events({{kLr, 0.5, 4}, {"Client/acc", 0.75, 4}});
  const auto records = detail::read_event_file(m.tensorboard()->file_path());
  ASSERT_EQ(records.size(), 3u);
  EXPECT_EQ(records[2].values.at(0).tag, "Client/acc");
  EXPECT_TRUE(fs::exists(dir.path() + "/csv/Train_Samples_lr.csv"));
  EXPECT_TRUE(fs::exists(dir.path() + "/csv/Client_acc.csv"));
}

TEST(MonitorMaster, OtherRanksCreateAndWriteNothing) {
  TempDir dir;
  auto c = config_with({{"csv_monitor", {{"enabled", true}, {"output_path", dir.path()}}}});
  MonitorMaster m(c, /*rank=*/1);
  EXPECT_TRUE(m.enabled());  // as DeepSpeed's monitor.enabled, on every rank
  EXPECT_EQ(m.csv_monitor(), nullptr);
  m.write_events({{kLr, 0.5, 4}});
  EXPECT_FALSE(fs::exists(dir.path() + "/DeepSpeedJobName"));
}

TEST(MonitorMaster, DisabledByDefault) {
  MonitorMaster m(config_with({}), 0);
  EXPECT_FALSE(m.enabled());
  m.write_events({{kLr, 0.5, 4}});
}

TEST(MonitorMaster, RefusesWandbAndCometByName) {
  EXPECT_THROW_WITH(MonitorMaster(config_with({{"wandb", {{"enabled", true}}}}), 0),
                    NotSupportedError, "wandb.enabled");
  EXPECT_THROW_WITH(MonitorMaster(config_with({{"comet", {{"enabled", true}}}}), 0),
                    NotSupportedError, "comet.enabled");
}

}  // namespace
}  // namespace deepspeed::monitor
