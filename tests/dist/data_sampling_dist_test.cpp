// data_efficiency.data_sampling on Gloo ranks against one process. The data analyzer's map on
// two workers and reduce on the first must write the files one worker writes, byte for byte
// (and the distributed analyzer on three, the same contents without map files);
// the sampler's ranks must each get their half of every micro-batch the single process draws
// (the first rank draws the global batch and broadcasts it), and only the first writes clusters.
#include "deepspeed/data_sampling.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "deepspeed/comm.h"
#include "deepspeed/deepspeed.h"
#include "support/multi_rank.h"
#include "support/tiny_model.h"

namespace deepspeed::data_sampling {
namespace {

using testing::rank_output_dir;
using testing::run_ranks;

constexpr int64_t kSamples = 101;  // split 50 / 51 over two workers
int64_t length(int64_t s) { return (s * 37) % 23 + 5; }

std::string bytes_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

const std::vector<std::string> kFiles = {"sample_to_metric", "index_to_sample",
                                         "index_to_metric", "index_to_sample_percentile_merged"};

TEST(DataAnalyzerDist, TwoWorkersWriteTheFilesOneWorkerWrites) {
  run_ranks(2, [](int, int) {
    DataAnalyzer analyzer(kSamples, rank_output_dir() + "/two");
    analyzer.add_metric("len", length);
    analyzer.run_map_reduce();
  });
  DataAnalyzer one(kSamples, rank_output_dir() + "/one", 1, 0);
  one.add_metric("len", length);
  one.run_map_reduce();
  for (const auto& name : kFiles) {
    for (const char* ext : {".bin", ".idx"}) {
      const std::string file = "/len/len_" + name + ext;
      const std::string two = bytes_of(rank_output_dir() + "/two" + file);
      ASSERT_FALSE(two.empty()) << file;
      EXPECT_EQ(two, bytes_of(rank_output_dir() + "/one" + file)) << file;
    }
  }
  // Both workers' maps are there: samples [0, 50) and [50, 101).
  EXPECT_EQ(MMapIndexedDataset(rank_output_dir() + "/two/len/worker1_thread0/len_sample_to_metric")
                .size(),
            51u);
}

// DistributedDataAnalyzer on 3 ranks (shares of 33, 34 and 34 samples) against DataAnalyzer on
// one worker: the same .bin files (DeepSpeed's own test of its two analyzers asserts that),
// each .idx one document where DataAnalyzer's merge ends three of them twice, and the
// accumulated vector alike, byte for byte.
TEST(DistributedDataAnalyzerDist, ThreeRanksWriteDataAnalyzersContentsWithoutSharedMapFiles) {
  auto buckets = [](int64_t s) {
    std::vector<int64_t> v(4, 0);
    v[static_cast<size_t>(s % 4)] = s;
    return v;
  };
  run_ranks(3, [&](int, int) {
    DistributedDataAnalyzer analyzer(kSamples, rank_output_dir() + "/dist");
    analyzer.add_metric("len", length);
    analyzer.add_accumulated_metric("buckets", buckets);
    analyzer.run_map_reduce();
  });
  const std::string root = rank_output_dir();
  DataAnalyzer one(kSamples, root + "/one", 1, 0);
  one.add_metric("len", length);
  one.add_accumulated_metric("buckets", buckets);
  one.run_map_reduce();
  for (const auto& name : kFiles) {
    const std::string file = "/len/len_" + name;
    const std::string bin = bytes_of(root + "/dist" + file + ".bin");
    ASSERT_FALSE(bin.empty()) << file;
    EXPECT_EQ(bin, bytes_of(root + "/one" + file + ".bin")) << file;
    const MMapIndexedDataset dist(root + "/dist" + file), reference(root + "/one" + file);
    ASSERT_EQ(dist.size(), reference.size()) << file;
    for (size_t i = 0; i < dist.size(); ++i) EXPECT_EQ(dist.item(i), reference.item(i)) << file;
    EXPECT_EQ(dist.doc_idx(), (std::vector<int64_t>{0, static_cast<int64_t>(dist.size())}))
        << file;
  }
  for (const char* ext : {".bin", ".idx"}) {
    const std::string file = std::string("/buckets/buckets_metric_value") + ext;
    EXPECT_EQ(bytes_of(root + "/dist" + file), bytes_of(root + "/one" + file)) << file;
  }
  // No map files: nothing but the outputs under the folder.
  EXPECT_FALSE(std::filesystem::exists(root + "/dist/len/worker0_thread0"));
}

json config(const std::string& root, const std::string& clusters, int64_t micro) {
  return {{"train_micro_batch_size_per_gpu", micro},
          {"gradient_accumulation_steps", 2},
          {"optimizer", {{"type", "SGD"}, {"params", {{"lr", 0.1}}}}},
          {"data_efficiency",
           {{"enabled", true},
            {"data_sampling",
             {{"enabled", true},
              {"num_epochs", 2},
              {"curriculum_learning",
               {{"enabled", true},
                {"data_cluster_path", clusters},
                {"curriculum_metrics",
                 {{"len",
                   {{"index_to_sample_path", root + "/analysis/len/len_index_to_sample"},
                    {"index_to_metric_path", root + "/analysis/len/len_index_to_metric"},
                    {"difficulty_type", "value"},
                    {"clustering_type", "schedule_based"},
                    {"min_difficulty", 10},
                    {"max_difficulty", 27},
                    {"schedule_type", "fixed_linear"},
                    {"schedule_config",
                     {{"total_curriculum_step", 6}, {"difficulty_step", 1}}}}}}}}}}}}}};
}

// Every micro-batch the sampler gives this process, to the end of its two epochs.
// `root`: the analysis' folder; clusters go to `clusters`.
std::vector<std::vector<int64_t>> draw(const std::string& root, const std::string& clusters,
                                       int64_t micro) {
  auto engine =
      initialize(std::make_shared<testing::TinyNetImpl>(), config(root, clusters, micro)).engine;
  auto sampler = make_engine_data_sampler(*engine, kSamples);
  std::vector<std::vector<int64_t>> out;
  while (auto batch = sampler->next()) {
    for (int64_t s : *batch) EXPECT_LE(length(s), sampler->current_difficulties().at("len"));
    out.push_back(*batch);
  }
  return out;
}

TEST(DataSamplerDist, EachRankGetsItsHalfOfTheMicroBatchesOneProcessDraws) {
  run_ranks(2, [](int rank, int) {
    const std::string root = rank_output_dir();
    DataAnalyzer analyzer(kSamples, root + "/analysis");
    analyzer.add_metric("len", length);
    analyzer.run_map_reduce();
    const auto batches = draw(root, root + "/r", 2);
    std::ofstream out(root + "/rank" + std::to_string(rank) + ".json");
    out << json(batches).dump();
  });
  const std::string root = rank_output_dir();  // set by run_ranks
  const auto reference = draw(root, root + "/one", 4);
  // 2 epochs of 101 samples in micro-batches of 4 (2 per rank): DeepSpeed's loop runs while
  // consumed <= total, so 51 of them.
  ASSERT_EQ(reference.size(), 51u);
  for (int rank = 0; rank < 2; ++rank) {
    std::ifstream in(root + "/rank" + std::to_string(rank) + ".json");
    const auto got = json::parse(in).get<std::vector<std::vector<int64_t>>>();
    ASSERT_EQ(got.size(), reference.size()) << "rank " << rank;
    for (size_t k = 0; k < got.size(); ++k) {
      const std::vector<int64_t> half(reference[k].begin() + 2 * rank,
                                      reference[k].begin() + 2 * rank + 2);
      EXPECT_EQ(got[k], half) << "rank " << rank << ", micro-batch " << k;
    }
  }
  // The same cluster files: global rank 0 wrote what the single process wrote.
  ASSERT_TRUE(std::filesystem::exists(root + "/one/cluster_len12.idx"));
  for (const auto& entry : std::filesystem::directory_iterator(root + "/one")) {
    const std::string name = entry.path().filename().string();
    EXPECT_EQ(bytes_of(root + "/r/" + name), bytes_of(entry.path().string())) << name;
  }
}

}  // namespace
}  // namespace deepspeed::data_sampling
