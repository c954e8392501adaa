// data_efficiency.data_sampling: DeepSpeed's MMapIndexedDataset files, the data analyzer's index
// files, the curriculum data sampler (clusters admitted by difficulty, batches drawn from them,
// epochs, resume) and its place in the engine's checkpoints.
#include "deepspeed/data_sampling.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deepspeed/deepspeed.h"
#include "runtime/data_efficiency/sampler_checkpoint.h"
#include "support/expect_throw.h"
#include "support/temp_dir.h"
#include "support/tiny_model.h"

namespace deepspeed::data_sampling {
namespace {

using Items = std::vector<std::vector<int64_t>>;

Items read_all(const std::string& prefix) {
  const MMapIndexedDataset d(prefix);
  Items out;
  for (size_t i = 0; i < d.size(); ++i) out.push_back(d.item(i));
  return out;
}

TEST(IndexedDataset, RoundTripsEveryElementTypeWithDeepSpeedsLayout) {
  testing::TempDir dir;
  const Items items = {{1, 2, 3}, {}, {200, 0}};
  for (auto dtype : {IndexDtype::kUInt8, IndexDtype::kInt16, IndexDtype::kInt32,
                     IndexDtype::kInt64, IndexDtype::kUInt16, IndexDtype::kUInt32,
                     IndexDtype::kUInt64}) {
    const std::string prefix = dir.file(std::string("d_") + dtype_name(dtype));
    write_indexed_dataset(prefix, dtype, items);
    const MMapIndexedDataset d(prefix);
    EXPECT_EQ(d.dtype(), dtype);
    EXPECT_EQ(read_all(prefix), items) << dtype_name(dtype);
    EXPECT_EQ(d.sizes(), (std::vector<int32_t>{3, 0, 2}));
    const auto w = static_cast<int64_t>(dtype_size(dtype));
    EXPECT_EQ(d.pointers(), (std::vector<int64_t>{0, 3 * w, 3 * w}));
    EXPECT_EQ(d.doc_idx(), (std::vector<int64_t>{0, 3}));
    EXPECT_EQ(d.item_slice(0, 1, 10), (std::vector<int64_t>{2, 3}));
  }
  // The header, byte by byte: magic, version 1, dtype code, 3 items, 2 document starts.
  std::ifstream in(dir.file("d_uint16.idx"), std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_EQ(bytes.size(), 34u + 3 * 4 + 3 * 8 + 2 * 8);
  EXPECT_EQ(bytes.substr(0, 9), std::string("MMIDIDX\0\0", 9));
  EXPECT_EQ(bytes[9], 1);
  EXPECT_EQ(bytes[17], 6);  // uint16
  EXPECT_EQ(bytes[18], 3);
  EXPECT_EQ(bytes[26], 2);
}

TEST(IndexedDataset, FitsDeepSpeedsNarrowestTypesAndRefusesBadFiles) {
  EXPECT_EQ(fit_int_dtype(0, 255), IndexDtype::kUInt8);
  EXPECT_EQ(fit_int_dtype(0, 256), IndexDtype::kUInt16);
  EXPECT_EQ(fit_int_dtype(0, 70000), IndexDtype::kUInt32);
  EXPECT_EQ(fit_int_dtype(0, 5000000000LL), IndexDtype::kUInt64);
  EXPECT_EQ(fit_int_dtype(-1, 127), IndexDtype::kInt8);
  EXPECT_EQ(fit_int_dtype(-1, 128), IndexDtype::kInt16);
  EXPECT_EQ(fit_int_dtype(-40000, 1), IndexDtype::kInt32);
  testing::TempDir dir;
  EXPECT_THROW_WITH(write_indexed_dataset(dir.file("small"), IndexDtype::kUInt8, {{256}}),
                    UsageError, "value 256 does not fit");
  EXPECT_FALSE(std::ifstream(dir.file("small.bin")).good());  // nothing half-written is left
  {
    std::ofstream bad(dir.file("bad.idx"), std::ios::binary);
    bad << std::string("TNTIDX\0\0 and more bytes than a header", 40);
  }
  EXPECT_THROW_WITH(MMapIndexedDataset(dir.file("bad")), UsageError,
                    "bad.idx: not an MMapIndexedDataset index");
  write_indexed_dataset(dir.file("cut"), IndexDtype::kInt64, {{1, 2}});
  std::filesystem::resize_file(dir.file("cut.idx"), 40);
  EXPECT_THROW_WITH(MMapIndexedDataset(dir.file("cut")), UsageError, "cut.idx: ");
  EXPECT_THROW_WITH(MMapIndexedDataset(dir.file("absent")), UsageError, "absent.idx");
}

TEST(IndexedDataset, MergesLikeDeepSpeedsBuilder) {
  testing::TempDir dir;
  write_indexed_dataset(dir.file("a"), IndexDtype::kInt32, {{1}, {2, 3}});
  MMapIndexedDatasetBuilder b(dir.file("m"), IndexDtype::kInt32);
  b.add_item({9});
  b.merge_file(dir.file("a"));
  b.finalize();
  EXPECT_EQ(read_all(dir.file("m")), (Items{{9}, {1}, {2, 3}}));
  // DeepSpeed's merge_file_ appends the other's document starts past its first, offset.
  EXPECT_EQ(MMapIndexedDataset(dir.file("m")).doc_idx(), (std::vector<int64_t>{0, 3, 3}));
  MMapIndexedDatasetBuilder wrong(dir.file("w"), IndexDtype::kInt64);
  EXPECT_THROW_WITH(wrong.merge_file(dir.file("a")), UsageError, "element type int32");
}

// ---------------------------------------------------------------------------------------------
// DataAnalyzer

TEST(DataAnalyzer, WritesDeepSpeedsIndexFiles) {
  testing::TempDir dir;
  DataAnalyzer analyzer(12, dir.path(), /*num_workers=*/1, /*worker_id=*/0);
  analyzer.add_metric("len", [](int64_t s) { return (s * 7) % 5 + 10; });
  analyzer.run_map_reduce();
  const std::string m = dir.file("len/len");
  Items per_sample;
  for (int64_t s = 0; s < 12; ++s) per_sample.push_back({(s * 7) % 5 + 10});
  EXPECT_EQ(read_all(m + "_sample_to_metric"), per_sample);
  EXPECT_EQ(MMapIndexedDataset(m + "_sample_to_metric").dtype(), IndexDtype::kUInt8);
  EXPECT_EQ(MMapIndexedDataset(m + "_sample_to_metric").doc_idx(),
            (std::vector<int64_t>{0, 12, 12}));
  EXPECT_EQ(read_all(m + "_index_to_metric"), (Items{{10}, {11}, {12}, {13}, {14}}));
  EXPECT_EQ(read_all(m + "_index_to_sample"),
            (Items{{0, 5, 10}, {3, 8}, {1, 6, 11}, {4, 9}, {2, 7}}));
  EXPECT_EQ(read_all(m + "_index_to_sample_percentile_merged"), read_all(m + "_index_to_sample"));
}

TEST(DataAnalyzer, MergesAPercentOfTheDistinctValuesPerRowAndSplitsWorkersAsLinspace) {
  testing::TempDir dir;
  DataAnalyzer a0(250, dir.path(), 3, 0);
  DataAnalyzer a1(250, dir.path(), 3, 1);
  DataAnalyzer a2(250, dir.path(), 3, 2);
  // numpy.linspace(0, 250, 4, dtype=int): 0, 83, 166, 250.
  EXPECT_EQ(a0.worker_range(0), (std::pair<int64_t, int64_t>{0, 83}));
  EXPECT_EQ(a0.worker_range(1), (std::pair<int64_t, int64_t>{83, 166}));
  EXPECT_EQ(a0.worker_range(2), (std::pair<int64_t, int64_t>{166, 250}));
  for (auto* a : {&a0, &a1, &a2}) {
    a->add_metric("v", [](int64_t s) { return 249 - s; });  // 250 distinct values
  }
  a1.run_map();
  EXPECT_THROW_WITH(a0.run_reduce(), UsageError, "worker0_thread0/v_sample_to_metric.idx");
  a0.run_map();
  a2.run_map();
  a0.run_reduce();
  const auto merged = read_all(dir.file("v/v_index_to_sample_percentile_merged"));
  ASSERT_EQ(merged.size(), 125u);  // 250 values in rows of 250 / 100 = 2
  EXPECT_EQ(merged.front(), (std::vector<int64_t>{249, 248}));
  EXPECT_EQ(merged.back(), (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(MMapIndexedDataset(dir.file("v/v_index_to_sample")).dtype(), IndexDtype::kUInt8);
}

// accumulate_value_over_samples: each worker sums its samples' vectors, the reduce sums the
// workers' into one item in the narrowest type holding it.
TEST(DataAnalyzer, AccumulatesAVectorOverTheSamplesOfEveryWorker) {
  testing::TempDir dir;
  auto histogram = [](int64_t s) {  // sample ids summed into 4 buckets, and a count
    std::vector<int64_t> v(5, 0);
    v[static_cast<size_t>(s % 4)] = s;
    v[4] = 1;
    return v;
  };
  DataAnalyzer w0(30, dir.path(), 2, 0);
  DataAnalyzer w1(30, dir.path(), 2, 1);
  for (auto* a : {&w0, &w1}) a->add_accumulated_metric("hist", histogram);
  w0.run_map();
  w1.run_map();
  // Worker 1 maps samples 15..29 only.
  EXPECT_EQ(read_all(dir.file("hist/worker1_thread0/hist_metric_value")),
            (Items{{16 + 20 + 24 + 28, 17 + 21 + 25 + 29, 18 + 22 + 26, 15 + 19 + 23 + 27, 15}}));
  w0.run_reduce();
  std::vector<int64_t> want(5, 0);
  for (int64_t s = 0; s < 30; ++s) {
    want[static_cast<size_t>(s % 4)] += s;
    want[4] += 1;
  }
  EXPECT_EQ(read_all(dir.file("hist/hist_metric_value")), (Items{want}));
  EXPECT_EQ(MMapIndexedDataset(dir.file("hist/hist_metric_value")).dtype(), IndexDtype::kUInt8);

  DataAnalyzer ragged(4, dir.file("ragged"), 1, 0);
  ragged.add_accumulated_metric("r", [](int64_t s) { return std::vector<int64_t>(s + 1, 1); });
  EXPECT_THROW_WITH(ragged.run_map(), UsageError, "an accumulated metric has one length");
  EXPECT_THROW_WITH(ragged.add_metric("r", [](int64_t) { return int64_t{0}; }), UsageError,
                    "metric \"r\" was added already");
}

// ---------------------------------------------------------------------------------------------
// DataSampler

constexpr int64_t kSamples = 40;

int64_t metric_a(int64_t s) { return s % 10; }         // 0..9
int64_t metric_b(int64_t s) { return (s * 3) % 8; }    // 0..7

// The analyzer's files for metrics a and b of kSamples samples under `dir`.
void analyze(const testing::TempDir& dir) {
  DataAnalyzer analyzer(kSamples, dir.file("analysis"), 1, 0);
  analyzer.add_metric("a", metric_a);
  analyzer.add_metric("b", metric_b);
  analyzer.run_map_reduce();
}

json metric(const testing::TempDir& dir, const std::string& name, const std::string& type,
            int64_t lo, int64_t hi, int64_t steps) {
  const std::string base = dir.file("analysis/" + name + "/" + name);
  json m = {{"index_to_sample_path", base + (type == "percentile"
                                                 ? "_index_to_sample_percentile_merged"
                                                 : "_index_to_sample")},
            {"index_to_metric_path", base + "_index_to_metric"},
            {"difficulty_type", type},
            {"clustering_type", "schedule_based"},
            {"min_difficulty", lo},
            {"max_difficulty", hi},
            {"schedule_type", "fixed_linear"},
            {"schedule_config", {{"total_curriculum_step", steps}, {"difficulty_step", 1}}}};
  return m;
}

json sampling_config(const testing::TempDir& dir, json metrics, int64_t epochs = 1000) {
  return {{"train_batch_size", 4},
          {"data_efficiency",
           {{"enabled", true},
            {"seed", 7},
            {"data_sampling",
             {{"enabled", true},
              {"num_epochs", epochs},
              {"curriculum_learning",
               {{"enabled", true},
                {"data_cluster_path", dir.file("clusters")},
                {"curriculum_metrics", std::move(metrics)}}}}}}}};
}

DataSampler make_sampler(const json& config, int64_t micro = 4, int64_t samples = kSamples) {
  DataSampler::Options o;
  o.one_epoch_total_samples = samples;
  o.micro_batch_size = micro;
  return DataSampler(data_sampling_config(DeepSpeedConfig::from_json(config, 1)), o);
}

TEST(DataSamplingConfig, ReadsTheSectionAndNamesEveryBadKey) {
  testing::TempDir dir;
  const json good = sampling_config(dir, {{"a", metric(dir, "a", "value", 2, 9, 7)}});
  const auto c = data_sampling_config(DeepSpeedConfig::from_json(good, 1));
  EXPECT_TRUE(c.enabled && c.curriculum_enabled);
  EXPECT_EQ(c.seed, 7);
  ASSERT_EQ(c.metrics.size(), 1u);
  EXPECT_EQ(c.metrics[0].schedule.max_difficulty, 9);
  EXPECT_NO_THROW(DeepSpeedConfig::from_json(good, 1).check_supported());
  const std::string path = "data_efficiency.data_sampling.curriculum_learning";
  auto fails = [&](json config, const std::string& what) {
    EXPECT_THROW_WITH(DeepSpeedConfig::from_json(config, 1), ConfigError, what);
  };
  json bad = good;
  bad["data_efficiency"]["data_sampling"]["curriculum_learning"].erase("data_cluster_path");
  fails(bad, path + ".data_cluster_path is required");
  bad = good;
  bad["data_efficiency"]["data_sampling"]["curriculum_learning"]["curriculum_metrics"] =
      json::object();
  fails(bad, path + ".curriculum_metrics names no metric");
  const std::string a = path + ".curriculum_metrics.a.";
  for (auto [key, value, message] :
       {std::tuple<const char*, json, std::string>{"difficulty_type", "rank",
                                                   "\"rank\"; expected \"value\" or"},
        {"clustering_type", "by_length", "\"by_length\"; expected \"schedule_based\""},
        {"schedule_type", "fixed_cubic", "\"fixed_cubic\"; expected fixed_linear"}}) {
    bad = good;
    bad["data_efficiency"]["data_sampling"]["curriculum_learning"]["curriculum_metrics"]["a"]
       [key] = value;
    fails(bad, a + key + " is " + message);
  }
  bad = good;
  bad["data_efficiency"]["data_sampling"]["curriculum_learning"]["curriculum_metrics"]["a"].erase(
      "index_to_metric_path");
  fails(bad, a + "index_to_metric_path is required with clustering_type \"schedule_based\"");
  bad = good;
  bad["data_efficiency"]["data_sampling"]["curriculum_learning"]["curriculum_metrics"]["a"]
     ["schedule_config"].erase("total_curriculum_step");
  fails(bad, a + "schedule_config.total_curriculum_step is required");
}

TEST(DataSampler, AdmitsSamplesByValueAsTheDifficultyRises) {
  testing::TempDir dir;
  analyze(dir);
  // fixed_linear from 2 to 9 over 7 steps: difficulty 3 at step 1, one more per step, 9 from 7.
  auto sampler = make_sampler(sampling_config(dir, {{"a", metric(dir, "a", "value", 2, 9, 7)}}));
  std::set<int64_t> seen;
  for (int64_t step = 1; step <= 12; ++step) {
    const auto batch = sampler.next();
    ASSERT_TRUE(batch.has_value());
    ASSERT_EQ(batch->size(), 4u);
    const int64_t difficulty = sampler.current_difficulties().at("a");
    EXPECT_EQ(difficulty, std::min<int64_t>(9, 2 + step));
    for (int64_t s : *batch) {
      EXPECT_LE(metric_a(s), difficulty) << "step " << step;
      seen.insert(metric_a(s));
    }
    EXPECT_EQ(sampler.curriculum_step(), step);
  }
  // One cluster per difficulty: values <= 3 (16 samples), then each new value (4 samples).
  EXPECT_EQ(sampler.data_cluster_sizes(), (std::vector<int64_t>{16, 4, 4, 4, 4, 4, 4}));
  // 12 batches of 4 read cluster a3 (16 samples) past its end: it continues reshuffled, from
  // a file of its own.
  EXPECT_EQ(sampler.data_cluster_paths().front(), "cluster_a3_shuffle1");
  EXPECT_EQ(sampler.data_cluster_paths().back(), "cluster_a9");
  const auto reshuffled = read_all(dir.file("clusters/cluster_a3_shuffle1"));
  ASSERT_EQ(reshuffled.size(), 1u);
  EXPECT_NE(reshuffled, read_all(dir.file("clusters/cluster_a3")));
  // Each cluster file holds its samples, shuffled.
  EXPECT_EQ(std::set<int64_t>(reshuffled[0].begin(), reshuffled[0].end()).size(), 16u);
  const auto first = read_all(dir.file("clusters/cluster_a3"));
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(std::set<int64_t>(first[0].begin(), first[0].end()),
            (std::set<int64_t>{0, 1, 2, 3, 10, 11, 12, 13, 20, 21, 22, 23, 30, 31, 32, 33}));
  EXPECT_GE(seen.size(), 8u);
}

TEST(DataSampler, PercentilesAndTwoMetricsIntersect) {
  testing::TempDir dir;
  analyze(dir);
  // Percentile 5 of 10 at step 1: 5 * (40 // 10) samples of the lowest values (0..4).
  auto sampler = make_sampler(
      sampling_config(dir, {{"a", metric(dir, "a", "percentile", 5, 10, 100)}}));
  ASSERT_TRUE(sampler.next().has_value());
  EXPECT_EQ(sampler.data_cluster_sizes(), (std::vector<int64_t>{20}));
  const auto cluster = read_all(dir.file("clusters/cluster_a5"))[0];
  for (int64_t s : cluster) EXPECT_LE(metric_a(s), 4);

  // The samples both metrics admit, then only those not admitted before.
  testing::TempDir dir2;
  analyze(dir2);
  auto two = make_sampler(sampling_config(dir2, {{"a", metric(dir2, "a", "value", 4, 9, 5)},
                                                 {"b", metric(dir2, "b", "value", 3, 7, 4)}}));
  std::map<std::string, int64_t> at_first;
  for (int step = 0; step < 6; ++step) {
    const auto batch = two.next();
    ASSERT_TRUE(batch.has_value());
    for (int64_t s : *batch) {
      EXPECT_LE(metric_a(s), two.current_difficulties().at("a"));
      EXPECT_LE(metric_b(s), two.current_difficulties().at("b"));
    }
    if (step == 0) at_first = two.current_difficulties();
  }
  EXPECT_EQ(at_first, (std::map<std::string, int64_t>{{"a", 5}, {"b", 4}}));
  int64_t both = 0;
  for (int64_t s = 0; s < kSamples; ++s) both += metric_a(s) <= 5 && metric_b(s) <= 4;
  EXPECT_EQ(two.data_cluster_sizes().front(), both);
  EXPECT_EQ(two.data_cluster_paths().front(), "cluster_a5_b4");
  int64_t total = 0;
  for (int64_t size : two.data_cluster_sizes()) total += size;
  EXPECT_EQ(total, kSamples);  // by the end every sample is in exactly one cluster
}

TEST(DataSampler, EndsAfterItsEpochsAndResumesTheSameDraws) {
  testing::TempDir dir;
  analyze(dir);
  const json config = sampling_config(dir, {{"a", metric(dir, "a", "value", 2, 9, 7)}}, 1);
  auto sampler = make_sampler(config, 3);
  std::vector<std::vector<int64_t>> batches;
  while (auto batch = sampler.next()) batches.push_back(*batch);
  // DeepSpeed's loop runs while consumed <= total: 40 samples in batches of 3 -> 14 batches.
  EXPECT_EQ(batches.size(), 14u);
  EXPECT_EQ(sampler.consumed_samples(), 42);

  auto first = make_sampler(config, 3);
  for (int k = 0; k < 5; ++k) first.next();
  const json state = first.state_dict();
  EXPECT_EQ(state.at("curriculum_step"), 5);
  EXPECT_EQ(state.at("data_cluster_paths").size(), 5u);
  auto resumed = make_sampler(config, 3);
  resumed.load_state_dict(state, "test");
  for (int k = 5; k < 14; ++k) EXPECT_EQ(resumed.next(), batches[static_cast<size_t>(k)]);
  EXPECT_FALSE(resumed.next().has_value());

  json no_cluster = state;
  no_cluster["data_cluster_paths"].push_back("cluster_a99");
  no_cluster["data_cluster_current_position"].push_back(0);
  auto broken = make_sampler(config, 3);
  EXPECT_THROW_WITH(broken.load_state_dict(no_cluster, "ckpt.pt"), CheckpointError,
                    "ckpt.pt: data_sampler names cluster cluster_a99");
}

// DeepSpeed's load_state_dict requires np_rng_state (numpy's global generator); ours is the state
// np.random.seed(data_efficiency.seed) leaves (numpy 1.24: np.random.seed(7) gives key words
// 7, 4097098180, 3572822661, ..., 1352272845 at pos 624). DeepSpeed's own np_rng_state holds an
// array, a tensor once loaded: it is dropped on load, and the rest resumes the sampler.
TEST(DataSampler, CheckpointsCarryNumpysGeneratorStateForDeepSpeed) {
  const json numpy = numpy_seeded_state(7);
  ASSERT_EQ(numpy.size(), 5u);
  EXPECT_EQ(numpy[0], "MT19937");
  ASSERT_EQ(numpy[1].size(), 624u);
  EXPECT_EQ(numpy[1][0], 7u);
  EXPECT_EQ(numpy[1][1], 4097098180u);
  EXPECT_EQ(numpy[1][2], 3572822661u);
  EXPECT_EQ(numpy[1][623], 1352272845u);
  EXPECT_EQ(numpy[2], 624);

  testing::TempDir dir;
  analyze(dir);
  const json config = sampling_config(dir, {{"a", metric(dir, "a", "value", 2, 9, 7)}}, 1);
  auto first = make_sampler(config, 3);
  for (int k = 0; k < 5; ++k) first.next();
  const json state = first.state_dict();
  EXPECT_EQ(state.at("np_rng_state"), numpy_seeded_state(7));  // data_efficiency.seed

  // As DeepSpeed's checkpoint holds it: np_rng_state's key is an ndarray (a tensor here).
  c10::IValue entry = checkpoint::ivalue_from_json(state);
  auto dict = entry.toGenericDict();
  dict.insert_or_assign("np_rng_state", c10::ivalue::Tuple::create(
      {c10::IValue("MT19937"), c10::IValue(at::zeros({624}, at::kLong)), c10::IValue(624)}));
  dict.erase("rng_state");
  const json restored = data_sampler_state_from_checkpoint(entry, "deepspeed.pt");
  EXPECT_FALSE(restored.contains("np_rng_state"));
  auto resumed = make_sampler(config, 3);
  resumed.load_state_dict(restored, "deepspeed.pt");
  EXPECT_EQ(resumed.state_dict().at("data_cluster_current_position"),
            state.at("data_cluster_current_position"));
  EXPECT_EQ(resumed.current_difficulties(), first.current_difficulties());
  EXPECT_THROW_WITH(checkpoint::json_from_ivalue(entry, "deepspeed.pt: data_sampler"),
                    CheckpointError, "deepspeed.pt: data_sampler");
}

TEST(DataSampler, ACustomScheduleIsRequiredBeforeTheFirstBatch) {
  testing::TempDir dir;
  analyze(dir);
  json m = metric(dir, "a", "value", 2, 9, 7);
  m["schedule_type"] = "custom";
  m.erase("schedule_config");
  auto sampler = make_sampler(sampling_config(dir, {{"a", m}}));
  EXPECT_THROW_WITH(sampler.next(), UsageError, "curriculum_metrics.a.schedule_type is \"custom\"");
  sampler.set_custom_curriculum_learning_schedule({{"a", [](int64_t step) { return step; }}});
  ASSERT_TRUE(sampler.next().has_value());
  EXPECT_EQ(sampler.curriculum_step(), 1);
  EXPECT_EQ(sampler.data_cluster_sizes(), (std::vector<int64_t>{8}));  // a <= 1
}

// ---------------------------------------------------------------------------------------------
// The engine

TEST(EngineDataSampler, CheckpointsKeepTheSamplerAndResumeItsDraws) {
  testing::TempDir dir;
  analyze(dir);
  json config = sampling_config(dir, {{"a", metric(dir, "a", "value", 2, 9, 7)}});
  config.erase("train_batch_size");
  config["train_micro_batch_size_per_gpu"] = 2;
  config["gradient_accumulation_steps"] = 2;
  config["optimizer"] = {{"type", "SGD"}, {"params", {{"lr", 0.1}}}};
  auto engine = initialize(std::make_shared<testing::TinyNetImpl>(), config).engine;
  auto sampler = make_engine_data_sampler(*engine, kSamples);
  EXPECT_EQ(engine_data_sampler(*engine), sampler.get());
  for (int k = 0; k < 5; ++k) sampler->next();
  engine->save_checkpoint(dir.path(), std::string("tag"));
  std::vector<std::vector<int64_t>> after;
  for (int k = 0; k < 6; ++k) after.push_back(*sampler->next());

  auto resumed = initialize(std::make_shared<testing::TinyNetImpl>(), config).engine;
  auto resumed_sampler = make_engine_data_sampler(*resumed, kSamples);
  resumed->load_checkpoint(dir.path(), std::string("tag"));
  EXPECT_EQ(resumed_sampler->curriculum_step(), 3);  // 5 micro-batches of 2 of 4-sample batches
  for (const auto& batch : after) EXPECT_EQ(*resumed_sampler->next(), batch);

  json off = config;
  off["data_efficiency"]["data_sampling"]["curriculum_learning"] = {{"enabled", false}};
  auto plain = initialize(std::make_shared<testing::TinyNetImpl>(), off).engine;
  EXPECT_THROW_WITH(make_engine_data_sampler(*plain, kSamples), UsageError,
                    "curriculum_learning.enabled is false");
}

}  // namespace
}  // namespace deepspeed::data_sampling
