// ds_elastic as a user (or a scheduler) runs it: DeepSpeed's output for DeepSpeed's own test
// config, and its errors.
#include <gtest/gtest.h>

#include "support/run_command.h"
#include "support/temp_dir.h"

namespace deepspeed {
namespace {

using testing::run_command;

// tests/unit/elasticity/test_elastic.py's config in DeepSpeed.
constexpr const char* kConfig = R"({"train_batch_size": 4, "elasticity": {"enabled": true,
    "max_train_batch_size": 10000, "micro_batch_sizes": [8, 12, 16, 17], "min_gpus": 32,
    "max_gpus": 1500, "min_time": 20, "version": 0.1}})";

constexpr const char* kSectionAsDeepSpeedPrintsIt = R"(------------------------------------------
Elasticity config:
------------------------------------------
{
    "enabled": true,
    "max_gpus": 1500,
    "max_train_batch_size": 10000,
    "micro_batch_sizes": [
        8,
        12,
        16,
        17
    ],
    "min_gpus": 32,
    "min_time": 20,
    "version": 0.1
}
)";

constexpr const char* kValid =
    "[32, 34, 36, 48, 51, 64, 68, 72, 96, 102, 136, 144, 153, 192, 204, 272, 288, 306, 408, 576, "
    "612, 816, 1224]";

TEST(DsElasticTool, PrintsWhatDeepSpeedsToolPrints) {
  testing::TempDir dir;
  const std::string cfg = dir.file("ds.json");
  testing::write_text_file(cfg, kConfig);
  auto r = run_command(std::string(DS_ELASTIC_BIN) + " -c " + cfg);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, std::string(kSectionAsDeepSpeedPrintsIt) +
                       "------------------------------------------\nCalculated results:\n"
                       "------------------------------------------\n"
                       "final_batch_size .... 9792\nvalid_gpus .......... " + kValid + "\n");
  r = run_command(std::string(DS_ELASTIC_BIN) + " -c " + cfg + " -w 64");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, std::string(kSectionAsDeepSpeedPrintsIt) +
                       "------------------------------------------\n"
                       "Calculated results for world size 64:\n"
                       "------------------------------------------\n"
                       "final_batch_size .... 9792\nvalid_gpus .......... " + kValid + "\n" +
                       "micro_batch_size .... 17\n");
}

TEST(DsElasticTool, InvalidWorldSizeOrConfigExitsOneWithTheError) {
  testing::TempDir dir;
  const std::string cfg = dir.file("ds.json");
  testing::write_text_file(cfg, kConfig);
  auto r = run_command(std::string(DS_ELASTIC_BIN) + " -c " + cfg + " --world-size 128");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("data-parallel size 128 is not one of the valid GPU counts"),
            std::string::npos) << r.err;
  testing::write_text_file(cfg, R"({"train_batch_size": 4})");
  r = run_command(std::string(DS_ELASTIC_BIN) + " -c " + cfg);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("'elasticity' is missing from the config"), std::string::npos) << r.err;
  testing::write_text_file(cfg, R"({"elasticity": {"enabled": true, "max_train_batch_size": 8}})");
  r = run_command(std::string(DS_ELASTIC_BIN) + " -c " + cfg);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("elasticity.micro_batch_sizes is missing"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace deepspeed
