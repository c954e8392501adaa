// data_efficiency.data_sampling against Python DeepSpeed 0.15.4 (.venv-deepspeed), through
// tests/e2e/deepspeed_data_sampling_interop.py:
// - DeepSpeed's DataAnalyzer and ours, over the same samples and metrics, write the same index
//   files byte for byte: the four of a single_value_per_sample metric and the one of an
//   accumulate_value_over_samples metric;
// - DeepSpeed's DeepSpeedDataSampler runs on the index files ours wrote, with the same config:
//   its difficulty at every global batch and the samples of every cluster it admits equal ours
//   (the order inside a cluster is each side's own random shuffle);
// - DeepSpeed's MMapIndexedDataset reads the cluster files our sampler wrote;
// - checkpoints both ways: DeepSpeed's sampler resumes from our sampler's state and ours from
//   DeepSpeed's, each continuing the other's curriculum step, consumed samples and the place in
//   every cluster file.
#include "deepspeed/data_sampling.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "deepspeed/checkpoint.h"
#include "runtime/data_efficiency/sampler_checkpoint.h"
#include "support/run_command.h"
#include "support/temp_dir.h"
#include "support/test_port.h"

namespace deepspeed::data_sampling {
namespace {

constexpr int64_t kSamples = 101;
constexpr int kGlobalBatches = 30;
constexpr int kSaveAt = 15;  // the checkpoint: after this many global batches
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

using Difficulties = std::map<std::string, int64_t>;
using Clusters = std::map<std::string, std::vector<int64_t>>;

std::vector<int64_t> sorted(std::vector<int64_t> v) {
  std::sort(v.begin(), v.end());
  return v;
}

// The samples a sampler read from its cluster files between two states: cluster c's file from
// position before[c] (0 for a cluster admitted since) to after[c]. Within one global batch no
// cluster may have been exhausted (checked: its file's name would have changed here, and its
// position would have gone back there).
std::vector<int64_t> read_between(const std::string& folder, const std::vector<int64_t>& before,
                                  const std::vector<std::string>& names,
                                  const std::vector<int64_t>& after) {
  std::vector<int64_t> samples;
  for (size_t c = 0; c < names.size(); ++c) {
    const int64_t from = c < before.size() ? before[c] : 0;
    EXPECT_GE(after[c], from) << names[c] << " was exhausted: choose another kSaveAt";
    const auto order = MMapIndexedDataset(folder + "/" + names[c]).item(0);
    for (int64_t i = from; i < after[c]; ++i) samples.push_back(order.at(static_cast<size_t>(i)));
  }
  return sorted(samples);
}

// One run of both sides, shared by the tests: ours first (the analyzer, then the sampler for
// kGlobalBatches, its state saved after kSaveAt), then DeepSpeed's script.
class DeepSpeedDataSamplingInterop : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir;
    DataAnalyzer analyzer(kSamples, dir_->file("ours"), 1, 0);
    analyzer.add_metric("len", length);
    analyzer.add_accumulated_metric("buckets", [](int64_t s) {
      std::vector<int64_t> sums(10, 0);
      sums[static_cast<size_t>(s % 10)] = s;
      return sums;
    });
    analyzer.run_map_reduce();

    auto sampler = make_sampler("our_clusters");
    for (int k = 0; k < kGlobalBatches; ++k) {
      if (!sampler->next().has_value()) break;
      ours_.push_back(sampler->current_difficulties());
      if (k + 1 == kSaveAt) {
        our_state_ = sampler->state_dict();
        checkpoint::save(checkpoint::ivalue_from_json({{"data_sampler", our_state_}}),
                         dir_->file("our_state.pt"));
      }
    }
    {
      std::ofstream out(dir_->file("ds_data_efficiency.json"));
      out << data_efficiency(*dir_, "their_clusters").dump();
    }
    const auto run = testing::run_command(
        std::string("OMP_NUM_THREADS=1 DS_ACCELERATOR=cpu ") + DS_DEEPSPEED_PYTHON + " " +
        DS_INTEROP_SCRIPT + " " + dir_->path() + " " + std::to_string(kSamples) + " " +
        std::to_string(kGlobalBatches) + " " + std::to_string(kSaveAt) + " " +
        std::to_string(testing::reserve_port()));
    script_ok_ = run.exit_code == 0;
    script_log_ = run.out + run.err;
    if (script_ok_) {
      std::ifstream in(dir_->file("deepspeed.json"));
      theirs_ = json::parse(in);
    }
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(script_ok_) << script_log_; }

  static std::unique_ptr<DataSampler> make_sampler(const std::string& clusters) {
    const json config = {{"train_batch_size", 4},
                         {"data_efficiency", data_efficiency(*dir_, clusters)}};
    DataSampler::Options options;
    options.one_epoch_total_samples = kSamples;
    options.micro_batch_size = 4;
    return std::make_unique<DataSampler>(
        data_sampling_config(DeepSpeedConfig::from_json(config, 1)), options);
  }

  static testing::TempDir* dir_;
  static std::vector<Difficulties> ours_;
  static json our_state_;
  static bool script_ok_;
  static std::string script_log_;
  static json theirs_;
};

testing::TempDir* DeepSpeedDataSamplingInterop::dir_ = nullptr;
std::vector<Difficulties> DeepSpeedDataSamplingInterop::ours_;
json DeepSpeedDataSamplingInterop::our_state_;
bool DeepSpeedDataSamplingInterop::script_ok_ = false;
std::string DeepSpeedDataSamplingInterop::script_log_;
json DeepSpeedDataSamplingInterop::theirs_;

TEST_F(DeepSpeedDataSamplingInterop, AnalyzerFilesAndCurriculumClustersMatchDeepSpeeds) {
  testing::TempDir& dir = *dir_;
  for (const char* name : {"len/len_sample_to_metric", "len/len_index_to_sample",
                           "len/len_index_to_metric", "len/len_index_to_sample_percentile_merged",
                           "buckets/buckets_metric_value"}) {
    for (const char* ext : {".bin", ".idx"}) {
      const std::string file = std::string("/") + name + ext;
      const std::string want = bytes_of(dir.file("theirs") + file);
      ASSERT_FALSE(want.empty()) << file;
      EXPECT_EQ(bytes_of(dir.file("ours") + file), want) << file;
    }
  }

  ASSERT_EQ(ours_.size(), static_cast<size_t>(kGlobalBatches));
  ASSERT_EQ(theirs_.at("difficulties").size(), ours_.size());
  for (size_t k = 0; k < ours_.size(); ++k) {
    EXPECT_EQ(theirs_.at("difficulties")[k].get<Difficulties>(), ours_[k])
        << "global batch " << k + 1;
  }
  // The clusters both admitted: DeepSpeed reshuffles in place, ours into NAME_shuffleK files.
  const auto their_clusters = theirs_.at("theirs").get<Clusters>();
  const auto read_by_them = theirs_.at("ours_read_by_deepspeed").get<Clusters>();
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

// DeepSpeed's load_state_dict on our checkpoint (np_rng_state included, which it requires):
// its next batch comes from each of our cluster files where our state left off.
TEST_F(DeepSpeedDataSamplingInterop, DeepSpeedResumesOurSamplersCheckpoint) {
  const json& resumed = theirs_.at("resumed_from_ours");
  ASSERT_EQ(resumed.at("difficulties").size(), static_cast<size_t>(kGlobalBatches - kSaveAt));
  for (int k = kSaveAt; k < kGlobalBatches; ++k) {
    EXPECT_EQ(resumed.at("difficulties")[k - kSaveAt].get<Difficulties>(),
              ours_[static_cast<size_t>(k)])
        << "global batch " << k + 1;
  }
  EXPECT_EQ(resumed.at("consumed_samples"), our_state_.at("consumed_samples").get<int64_t>() + 4);
  const auto names = resumed.at("paths").get<std::vector<std::string>>();
  const auto saved_names = our_state_.at("data_cluster_paths").get<std::vector<std::string>>();
  EXPECT_EQ(names, saved_names);  // the schedule admits its last cluster at step 12
  EXPECT_EQ(sorted(resumed.at("first_batch").get<std::vector<int64_t>>()),
            read_between(dir_->file("our_clusters"),
                         our_state_.at("data_cluster_current_position").get<std::vector<int64_t>>(),
                         names, resumed.at("positions").get<std::vector<int64_t>>()));
}

// Ours on DeepSpeed's checkpoint, as the engine reads its `data_sampler` entry (numpy's
// generator state in it): the curriculum continues DeepSpeed's, and the first batch comes from
// each of DeepSpeed's cluster files (as they were at the save) where its state left off.
TEST_F(DeepSpeedDataSamplingInterop, WeResumeDeepSpeedsSamplerCheckpoint) {
  const c10::IValue file = checkpoint::load(dir_->file("their_state.pt"));
  const json state = data_sampler_state_from_checkpoint(
      file.toGenericDict().at("data_sampler"), "their_state.pt: data_sampler");
  EXPECT_FALSE(state.contains("rng_state"));
  auto sampler = make_sampler("their_clusters_at_save");
  sampler->load_state_dict(state, "their_state.pt");
  EXPECT_EQ(sampler->current_difficulties(),
            theirs_.at("difficulties")[kSaveAt - 1].get<Difficulties>());

  const auto first = sampler->next();
  ASSERT_TRUE(first.has_value());
  const json after = sampler->state_dict();
  EXPECT_EQ(after.at("consumed_samples"), state.at("consumed_samples").get<int64_t>() + 4);
  EXPECT_EQ(sorted(*first),
            read_between(dir_->file("their_clusters_at_save"),
                         state.at("data_cluster_current_position").get<std::vector<int64_t>>(),
                         after.at("data_cluster_paths").get<std::vector<std::string>>(),
                         after.at("data_cluster_current_position").get<std::vector<int64_t>>()));
  for (int k = kSaveAt; k < kGlobalBatches; ++k) {
    if (k > kSaveAt) ASSERT_TRUE(sampler->next().has_value());
    EXPECT_EQ(sampler->current_difficulties(),
              theirs_.at("difficulties")[k].get<Difficulties>())
        << "global batch " << k + 1;
  }
}

}  // namespace
}  // namespace deepspeed::data_sampling
