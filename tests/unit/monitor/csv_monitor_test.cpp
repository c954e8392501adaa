// CsvMonitor: DeepSpeed's file names, header rows and "step,value" rows.
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "deepspeed/monitor.h"
#include "support/temp_dir.h"

namespace deepspeed::monitor {
namespace {

using testing::TempDir;

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

MonitorConfig csv_config(const std::string& out) {
  MonitorConfig c;
  c.enabled = true;
  c.output_path = out;
  return c;  // job_name stays DeepSpeed's default
}

TEST(CsvMonitor, OneFilePerSeriesWithHeaderAndRows) {
  TempDir dir;
  CsvMonitor csv(csv_config(dir.path()));
  EXPECT_EQ(csv.log_dir(), dir.path() + "/DeepSpeedJobName");
  csv.write_events({{kLr, 0.001, 8}, {kTrainLoss, 10.8125, 0}});
  csv.write_events({{kLr, 1e-05, 16}, {kTrainLoss, 3.0, 8}});
  EXPECT_EQ(csv.file_for(kLr), dir.path() + "/DeepSpeedJobName/Train_Samples_lr.csv");
  EXPECT_EQ(read(csv.file_for(kLr)), "step,lr\r\n8,0.001\r\n16,1e-05\r\n");
  EXPECT_EQ(read(dir.path() + "/DeepSpeedJobName/Train_Samples_train_loss.csv"),
            "step,train_loss\r\n0,10.8125\r\n8,3.0\r\n");
}

TEST(CsvMonitor, SpacesAndSlashesBecomeUnderscoresHeaderIsLastComponent) {
  TempDir dir;
  CsvMonitor csv(csv_config(dir.path()));
  csv.write_events({{"Eval/top 1 accuracy", 0.5, 3}, {"plain", 2.0, 4}});
  EXPECT_EQ(read(dir.path() + "/DeepSpeedJobName/Eval_top_1_accuracy.csv"),
            "step,top 1 accuracy\r\n3,0.5\r\n");
  EXPECT_EQ(read(dir.path() + "/DeepSpeedJobName/plain.csv"), "step,plain\r\n4,2.0\r\n");
}

TEST(CsvMonitor, ANewMonitorAppendsWithAnotherHeaderAsDeepSpeedDoes) {
  TempDir dir;
  CsvMonitor(csv_config(dir.path())).write_events({{kLr, 0.5, 1}});
  CsvMonitor(csv_config(dir.path())).write_events({{kLr, 0.25, 2}});
  EXPECT_EQ(read(dir.path() + "/DeepSpeedJobName/Train_Samples_lr.csv"),
            "step,lr\r\n1,0.5\r\nstep,lr\r\n2,0.25\r\n");
}

}  // namespace
}  // namespace deepspeed::monitor
