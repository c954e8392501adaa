// data_efficiency.data_sampling against Python DeepSpeed 0.15.4 (.venv-deepspeed), through
// tests/e2e/deepspeed_data_sampling_interop.py:
// - DeepSpeed's DataAnalyzer and ours, over the same samples and metric, write the same four
//   index files byte for byte;
// - DeepSpeed's DeepSpeedDataSampler runs on the index files ours wrote, with the same config:
//   its difficulty at every global batch and the samples of every cluster it admits equal ours
//   (the order inside a cluster is each side's own random shuffle);
// - DeepSpeed's MMapIndexedDataset reads the cluster files our sampler wrote.
#include "deepspeed/data_sampling.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/run_command.h"
#include "support/temp_dir.h"
#include "support/test_port.h"

namespace deepspeed::data_sampling {
namespace {

constexpr int64_t kSamples = 101;
constexpr int kGlobalBatches = 30;
int64_t length(int64_t s) { return (s * 37) % 23 + 5; }

std::string bytes_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

json data_efficiency(const testing::TempDir& dir, const std::string& clusters) {
  const std::string base = dir.file("ours/len/len");
  return {{"enabled", true},
          {"seed", 7},
          {"data_sampling",
           {{"enabled", true},
            {"num_epochs", 10},
            {"curriculum_learning",
             {{"enabled", true},
              {"data_cluster_path", dir.file(clusters)},
              {"curriculum_metrics",
               {{"len",
                 {{"index_to_sample_path", base + "_index_to_sample"},
                  {"index_to_metric_path", base + "_index_to_metric"},
                  {"difficulty_type", "value"},
                  {"clustering_type", "schedule_based"},
                  {"min_difficulty", 9},
                  {"max_difficulty", 27},
                  {"schedule_type", "fixed_root"},
                  {"schedule_config",
                   {{"total_curriculum_step", 12},
                    {"difficulty_step", 2},
                    {"root_degree", 2}}}}}}}}}}}};
}

TEST(DeepSpeedDataSamplingInterop, AnalyzerFilesAndCurriculumClustersMatchDeepSpeeds) {
  testing::TempDir dir;
  DataAnalyzer analyzer(kSamples, dir.file("ours"), 1, 0);
  analyzer.add_metric("len", length);
  analyzer.run_map_reduce();

  const json config = {{"train_batch_size", 4},
                       {"data_efficiency", data_efficiency(dir, "our_clusters")}};
  DataSampler::Options options;
  options.one_epoch_total_samples = kSamples;
  options.micro_batch_size = 4;
  DataSampler sampler(data_sampling_config(DeepSpeedConfig::from_json(config, 1)), options);
  std::vector<std::map<std::string, int64_t>> ours;
  for (int k = 0; k < kGlobalBatches; ++k) {
    ASSERT_TRUE(sampler.next().has_value());
    ours.push_back(sampler.current_difficulties());
  }
  {
    std::ofstream out(dir.file("ds_data_efficiency.json"));
    out << data_efficiency(dir, "their_clusters").dump();
  }
  const auto run = testing::run_command(
      std::string("OMP_NUM_THREADS=1 DS_ACCELERATOR=cpu ") + DS_DEEPSPEED_PYTHON + " " +
      DS_INTEROP_SCRIPT + " " + dir.path() + " " + std::to_string(kSamples) + " " +
      std::to_string(kGlobalBatches) + " " + std::to_string(testing::reserve_port()));
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
  std::ifstream in(dir.file("deepspeed.json"));
  const json theirs = json::parse(in);

  for (const char* name : {"sample_to_metric", "index_to_sample", "index_to_metric",
                           "index_to_sample_percentile_merged"}) {
    for (const char* ext : {".bin", ".idx"}) {
      const std::string file = std::string("/len/len_") + name + ext;
      const std::string want = bytes_of(dir.file("theirs") + file);
      ASSERT_FALSE(want.empty()) << file;
      EXPECT_EQ(bytes_of(dir.file("ours") + file), want) << file;
    }
  }

  using Difficulties = std::map<std::string, int64_t>;
  using Clusters = std::map<std::string, std::vector<int64_t>>;
  ASSERT_EQ(theirs.at("difficulties").size(), ours.size());
  for (size_t k = 0; k < ours.size(); ++k) {
    EXPECT_EQ(theirs.at("difficulties")[k].get<Difficulties>(), ours[k])
        << "global batch " << k + 1;
  }
  // The clusters both admitted: DeepSpeed reshuffles in place, ours into NAME_shuffleK files.
  const auto their_clusters = theirs.at("theirs").get<Clusters>();
  const auto read_by_them = theirs.at("ours_read_by_deepspeed").get<Clusters>();
  std::set<std::string> our_names;
  for (const auto& [name, samples] : read_by_them) {
    if (name.find("_shuffle") == std::string::npos) our_names.insert(name);
  }
  std::set<std::string> their_names;
  for (const auto& entry : their_clusters) their_names.insert(entry.first);
  EXPECT_EQ(our_names, their_names);
  EXPECT_GE(their_names.size(), 5u);
  for (const auto& [name, samples] : read_by_them) {
    const std::string base = name.substr(0, name.find("_shuffle"));
    ASSERT_TRUE(their_clusters.count(base)) << name;
    EXPECT_EQ(samples, their_clusters.at(base)) << name;
  }
}

}  // namespace
}  // namespace deepspeed::data_sampling
