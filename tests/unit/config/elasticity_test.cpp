// Elasticity: compute_elastic_config against DeepSpeed's own answers, DeepSpeed's error cases,
// and the batch triad DeepSpeedConfig takes from it.
#include "deepspeed/elasticity.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <map>

#include "support/expect_throw.h"

namespace deepspeed::elasticity {
namespace {

// DeepSpeed's tests/unit/elasticity/test_elastic.py config; every case overrides some keys.
json base_section() {
  return json::parse(R"({"enabled": true, "max_train_batch_size": 10000,
      "micro_batch_sizes": [8, 12, 16, 17], "min_gpus": 32, "max_gpus": 1500, "min_time": 20,
      "version": 0.1})");
}

// The cases of tests/golden/elasticity_golden.py, which printed the table below.
const std::map<std::string, std::string>& overrides() {
  static const std::map<std::string, std::string> cases = {
      {"DeepSpeedsTestConfigV01", "{}"},
      {"ProperMicroBatch",
       R"({"max_train_batch_size": 32, "micro_batch_sizes": [1, 2, 3, 7], "min_gpus": 1})"},
      {"PreferSmallerV01", R"({"prefer_larger_batch": false, "min_gpus": 1, "max_gpus": 64})"},
      {"FewGpusV01", R"({"max_train_batch_size": 100, "micro_batch_sizes": [2, 5], "min_gpus": 3,
                         "max_gpus": 9})"},
      {"LargeMicroV01", R"({"max_train_batch_size": 100, "micro_batch_sizes": [2, 40],
                            "min_gpus": 3, "max_gpus": 9})"},
      {"TinyShareV01", R"({"max_train_batch_size": 60, "micro_batch_sizes": [2, 30],
                           "min_gpus": 3, "max_gpus": 9})"},
      {"HugeBatchV01", R"({"max_train_batch_size": 2000000, "micro_batch_sizes": [2],
                           "min_gpus": 1, "max_gpus": 6})"},
      {"DefaultsV02", R"({"max_train_batch_size": 2000, "micro_batch_sizes": [2, 4, 6],
                          "min_gpus": 1, "max_gpus": 10000, "version": 0.2})"},
      {"ModelParallelV02", R"({"model_parallel_size": 4, "num_gpus_per_node": 8, "min_gpus": 8,
                               "max_gpus": 256, "version": 0.2})"},
      {"NodesV02", R"({"num_gpus_per_node": 4, "max_train_batch_size": 1000,
                       "micro_batch_sizes": [2, 3, 5], "min_gpus": 4, "max_gpus": 64,
                       "version": 0.2})"},
      {"PreferSmallerV02", R"({"prefer_larger_batch": false, "max_train_batch_size": 500,
                               "micro_batch_sizes": [4, 6], "min_gpus": 1, "max_gpus": 32,
                               "version": 0.2})"},
  };
  return cases;
}

ElasticityConfig config_of(const std::string& name) {
  json section = base_section();
  section.update(json::parse(overrides().at(name)));
  return read_elasticity_config(section, name);
}

struct Golden {
  const char* name;
  int64_t world_size;
  int64_t final_batch;
  std::vector<int64_t> valid;
  int64_t micro;      // 0: none (no world size given)
  const char* error;  // DeepSpeed's exception class, "" for none
};

// DS_SRC=<DeepSpeed edaa722>/deepspeed python3 tests/golden/elasticity_golden.py
const std::vector<int64_t> kTestConfigValid = {32,  34,  36,  48,  51,  64,  68,  72,
                                               96,  102, 136, 144, 153, 192, 204, 272,
                                               288, 306, 408, 576, 612, 816, 1224};
const std::vector<int64_t> kProperValid = {1, 2, 3, 4, 6, 8, 12, 24};
const std::vector<int64_t> kSmallerV01Valid = {1,  2,  3,  4,  5,  6,  7,  8,  10, 12, 14, 15,
                                               16, 20, 21, 24, 28, 30, 35, 40, 42, 56, 60};
const std::vector<int64_t> kDefaultsV02Valid = {1,  2,  3,  4,  5,   6,   7,   8,   10,  12,  14,
                                                15, 20, 21, 24, 28,  30,  35,  40,  42,  56,  60,
                                                70, 84, 105, 120, 140, 168, 210, 280, 420, 840};
const std::vector<int64_t> kModelParallelValid = {2,  4,  6,  8,  10, 12, 16, 18,
                                                  20, 24, 30, 36, 40, 48, 54, 60};
const std::vector<int64_t> kNodesValid = {4, 8, 12, 16, 20, 24, 32, 40, 48, 60, 64};
const std::vector<int64_t> kSmallerV02Valid = {1, 2, 3, 4, 5, 6, 8, 10, 12, 15, 16, 20, 24, 30};
const std::vector<Golden> kGolden = {
    {"DeepSpeedsTestConfigV01", 0, 9792, kTestConfigValid, 0, ""},
    {"DeepSpeedsTestConfigV01", 64, 9792, kTestConfigValid, 17, ""},
    {"DeepSpeedsTestConfigV01", 128, 0, {}, 0, "ElasticityIncompatibleWorldSize"},
    {"DeepSpeedsTestConfigV01", 34, 9792, kTestConfigValid, 16, ""},
    {"ProperMicroBatch", 0, 24, kProperValid, 0, ""},
    {"ProperMicroBatch", 4, 24, kProperValid, 3, ""},
    {"ProperMicroBatch", 7, 0, {}, 0, "ElasticityIncompatibleWorldSize"},
    {"ProperMicroBatch", 1, 24, kProperValid, 3, ""},
    {"PreferSmallerV01", 0, 6720, kSmallerV01Valid, 0, ""},
    {"PreferSmallerV01", 16, 6720, kSmallerV01Valid, 12, ""},
    {"FewGpusV01", 0, 96, {3, 4, 6, 8}, 0, ""},
    {"FewGpusV01", 5, 0, {}, 0, "ElasticityIncompatibleWorldSize"},
    {"LargeMicroV01", 0, 96, {3, 4, 6, 8}, 0, ""},
    {"LargeMicroV01", 2, 0, {}, 0, "ElasticityIncompatibleWorldSize"},
    {"TinyShareV01", 0, 48, {3, 4, 6, 8}, 0, ""},
    {"HugeBatchV01", 0, 1441440, {1, 2, 3, 4, 5, 6}, 0, ""},
    {"HugeBatchV01", 4, 1441440, {1, 2, 3, 4, 5, 6}, 2, ""},
    {"DefaultsV02", 1, 1680, kDefaultsV02Valid, 6, ""},
    {"DefaultsV02", 2, 1680, kDefaultsV02Valid, 6, ""},
    {"DefaultsV02", 3, 1680, kDefaultsV02Valid, 4, ""},
    {"DefaultsV02", 4, 1680, kDefaultsV02Valid, 6, ""},
    {"DefaultsV02", 5, 1680, kDefaultsV02Valid, 6, ""},
    {"DefaultsV02", 7, 1680, kDefaultsV02Valid, 6, ""},
    {"DefaultsV02", 8, 1680, kDefaultsV02Valid, 6, ""},
    {"DefaultsV02", 16, 1984, {16}, 4, ""},
    {"ModelParallelV02", 2, 0, {}, 0, "ElasticityIncompatibleWorldSize"},
    {"ModelParallelV02", 4, 0, {}, 0, "ElasticityIncompatibleWorldSize"},
    {"ModelParallelV02", 6, 0, {}, 0, "ElasticityIncompatibleWorldSize"},
    {"ModelParallelV02", 16, 8640, kModelParallelValid, 12, ""},
    {"ModelParallelV02", 24, 8640, kModelParallelValid, 12, ""},
    {"NodesV02", 4, 960, kNodesValid, 5, ""},
    {"NodesV02", 6, 996, {6}, 2, ""},
    {"NodesV02", 8, 960, kNodesValid, 5, ""},
    {"NodesV02", 12, 960, kNodesValid, 5, ""},
    {"NodesV02", 20, 960, kNodesValid, 3, ""},
    {"PreferSmallerV02", 2, 480, kSmallerV02Valid, 6, ""},
    {"PreferSmallerV02", 3, 480, kSmallerV02Valid, 4, ""},
    {"PreferSmallerV02", 9, 468, {9}, 4, ""},
};

TEST(Elasticity, MatchesDeepSpeedOnEveryGoldenCase) {
  for (const Golden& g : kGolden) {
    SCOPED_TRACE(std::string(g.name) + " world " + std::to_string(g.world_size));
    const ElasticityConfig config = config_of(g.name);
    if (std::string(g.error) == "ElasticityIncompatibleWorldSize") {
      EXPECT_THROW(compute_elastic_config(config, g.world_size, g.name),
                   ElasticityIncompatibleWorldSize);
      continue;
    }
    const ElasticBatch got = compute_elastic_config(config, g.world_size, g.name);
    EXPECT_EQ(got.final_batch_size, g.final_batch);
    EXPECT_EQ(got.valid_gpus, g.valid);
    if (g.micro > 0) {
      ASSERT_TRUE(got.micro_batch_size.has_value());
      EXPECT_EQ(*got.micro_batch_size, g.micro);
    }
    // Every valid size divides the batch into whole micro-batches (DeepSpeed's test_basic_10k).
    for (int64_t gpus : got.valid_gpus) {
      if (config.version != 0.1) break;
      ASSERT_EQ(got.final_batch_size % gpus, 0) << gpus;
      bool fits = false;
      for (int64_t mb : config.micro_batch_sizes) fits |= (got.final_batch_size / gpus) % mb == 0;
      EXPECT_TRUE(fits) << gpus;
    }
  }
}

TEST(Elasticity, IncompatibleWorldSizeNamesTheValidCounts) {
  EXPECT_THROW_WITH(compute_elastic_config(config_of("ProperMicroBatch"), 7, "ds.json"),
                    ElasticityIncompatibleWorldSize,
                    "ds.json: elasticity: data-parallel size 7 is not one of the valid GPU counts "
                    "[1, 2, 3, 4, 6, 8, 12, 24] for batch size 24");
}

// DeepSpeed's error cases (test_elastic.py), each an ElasticityError naming what is wrong.
TEST(Elasticity, DeepSpeedsErrorCases) {
  auto with = [](const std::string& changes) {
    json section = base_section();
    section.update(json::parse(changes));
    return section;
  };
  auto compute = [&](const std::string& changes, int64_t world = 0) {
    return compute_elastic_config(read_elasticity_config(with(changes), "ds.json"), world,
                                  "ds.json");
  };
  EXPECT_THROW_WITH(compute(R"({"enabled": false})"), ElasticityError, "elasticity is disabled");
  EXPECT_THROW_WITH(compute(R"({"version": 0.3})"), ElasticityError,
                    "elasticity.version is 0.3; this build computes up to version 0.2");
  json missing = base_section();
  missing.erase("max_train_batch_size");
  EXPECT_THROW_WITH(read_elasticity_config(missing, "ds.json"), ElasticityError,
                    "elasticity.max_train_batch_size is missing");
  missing = base_section();
  missing.erase("micro_batch_sizes");
  EXPECT_THROW_WITH(read_elasticity_config(missing, "ds.json"), ElasticityError,
                    "elasticity.micro_batch_sizes is missing");
  EXPECT_THROW_WITH(read_elasticity_config(json{{"enabled", true}}, "ds.json"), ElasticityError,
                    "is missing");
  EXPECT_THROW_WITH(compute(R"({"model_parallel_size": 4, "num_gpus_per_node": 8})"),
                    ElasticityError, "elasticity version 0.1 does not support model parallelism");
  EXPECT_THROW_WITH(
      compute(R"({"model_parallel_size": 16, "num_gpus_per_node": 8, "version": 0.2})", 16),
      ElasticityError, "needs num_gpus_per_node (8) divisible by model_parallel_size (16)");
  // test_invalid_config_values
  for (const char* bad : {R"({"micro_batch_sizes": [1, 4, -1, 2, -10]})", R"({"min_gpus": -1})",
                          R"({"max_gpus": -1})", R"({"micro_batch_sizes": 5})",
                          R"({"micro_batch_sizes": ["a", null, 0.5]})",
                          R"({"micro_batch_sizes": [2, 0.5, 4]})", R"({"min_time": -1})"}) {
    SCOPED_TRACE(bad);
    EXPECT_THROW(compute(bad), ElasticityError);
  }
  EXPECT_THROW_WITH(compute(R"({"micro_batch_sizes": [2, 20000]})"), ElasticityError,
                    "must all be at most the maximum batch size 10000");
}

// test_model_parallel_v2_valid: version 0.2 without a world size reads WORLD_SIZE.
TEST(Elasticity, Version02ReadsWorldSizeFromTheEnvironment) {
  json section = base_section();
  section.update(json::parse(R"({"model_parallel_size": 4, "num_gpus_per_node": 8,
                                 "version": 0.2})"));
  const ElasticityConfig config = read_elasticity_config(section, "ds.json");
  ::unsetenv("WORLD_SIZE");
  EXPECT_THROW_WITH(compute_elastic_config(config, 0, "ds.json"), ElasticityError,
                    "set WORLD_SIZE (it is unset)");
  ::setenv("WORLD_SIZE", "sixteen", 1);
  EXPECT_THROW_WITH(compute_elastic_config(config, 0, "ds.json"), ElasticityError,
                    "(it is \"sixteen\")");
  ::setenv("WORLD_SIZE", "16", 1);
  const ElasticBatch from_env = compute_elastic_config(config, 0, "ds.json");
  ::unsetenv("WORLD_SIZE");
  // DeepSpeed answers (9996, [4], 16): 16 GPUs are 4 data-parallel ranks, and the micro-batch is
  // picked for 9996 // 16 samples.
  EXPECT_EQ(from_env.final_batch_size, 9996);
  EXPECT_EQ(from_env.valid_gpus, (std::vector<int64_t>{4}));
  EXPECT_EQ(from_env.micro_batch_size, 16);
  // Given, the world size is the data-parallel size, and 16 is not a valid one (DeepSpeed too).
  EXPECT_THROW(compute_elastic_config(config, 16, "ds.json"), ElasticityIncompatibleWorldSize);
}

// --- DeepSpeedConfig: the batch triad from the elasticity section ---

// Sets (or unsets, for nullptr) an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    value ? ::setenv(name, value, 1) : ::unsetenv(name);
  }
  ~ScopedEnv() { old_ ? ::setenv(name_, old_->c_str(), 1) : ::unsetenv(name_); }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

constexpr const char* kElastic = R"("elasticity": {"enabled": true, "max_train_batch_size": 32,
    "micro_batch_sizes": [1, 2, 3, 7], "min_gpus": 1, "version": 0.1})";

DeepSpeedConfig parse(const std::string& extra, int64_t world) {
  return DeepSpeedConfig::from_string("{" + extra + (extra.empty() ? "" : ", ") + kElastic + "}",
                                      world);
}

bool any_contains(const std::vector<std::string>& lines, const std::string& part) {
  for (const auto& line : lines) {
    if (line.find(part) != std::string::npos) return true;
  }
  return false;
}

TEST(ElasticityConfig, SetsTheBatchTriadForEachDataParallelSize) {
  ScopedEnv no_scheduler(kSchedulerConfigEnv, nullptr);
  // Batch 24 for every valid size: micro 3 while it divides the per-rank share, then the rest.
  const std::map<int64_t, std::pair<int64_t, int64_t>> micro_and_accum = {
      {1, {3, 8}}, {2, {3, 4}}, {4, {3, 2}}, {8, {3, 1}}, {12, {2, 1}}, {24, {1, 1}}};
  for (auto [world, expected] : micro_and_accum) {
    SCOPED_TRACE(world);
    const DeepSpeedConfig c = parse("", world);
    EXPECT_EQ(c.batch.train_batch_size, 24);
    EXPECT_EQ(c.batch.train_micro_batch_size_per_gpu, expected.first);
    EXPECT_EQ(c.batch.gradient_accumulation_steps, expected.second);
    EXPECT_TRUE(any_contains(c.notes, "valid data-parallel sizes [1, 2, 3, 4, 6, 8, 12, 24]"));
    EXPECT_TRUE(any_contains(c.warnings, "DEEPSPEED_ELASTICITY_CONFIG is not set"));
    EXPECT_NO_THROW(c.check_supported());
  }
  EXPECT_THROW_WITH(parse("", 5), ElasticityIncompatibleWorldSize, "data-parallel size 5");
}

TEST(ElasticityConfig, BatchKeysAreAnErrorUnlessIgnoredThenOverridden) {
  ScopedEnv no_scheduler(kSchedulerConfigEnv, nullptr);
  EXPECT_THROW_WITH(parse(R"("train_micro_batch_size_per_gpu": 2)", 2), ConfigError,
                    "train_micro_batch_size_per_gpu is set, and so is elasticity.enabled");
  const auto c = DeepSpeedConfig::from_string(
      R"({"train_batch_size": 8, "gradient_accumulation_steps": "auto",
          "elasticity": {"enabled": true, "max_train_batch_size": 32,
          "micro_batch_sizes": [1, 2, 3, 7], "min_gpus": 1, "version": 0.1,
          "ignore_non_elastic_batch_info": true}})",
      2);
  EXPECT_EQ(c.batch.train_batch_size, 24);
  EXPECT_EQ(c.batch.gradient_accumulation_steps, 4);
  EXPECT_TRUE(any_contains(c.warnings, "[Elasticity] overriding train_batch_size: 8 -> 24"));
  EXPECT_TRUE(any_contains(c.warnings,
                           "[Elasticity] overriding gradient_accumulation_steps: \"auto\" -> 4"));
}

TEST(ElasticityConfig, TheSchedulersSectionMustMatch) {
  {
    ScopedEnv same(kSchedulerConfigEnv, R"({"enabled": true, "max_train_batch_size": 32,
                   "micro_batch_sizes": [1, 2, 3, 7], "version": 0.1, "min_gpus": 2})");
    const DeepSpeedConfig c = parse("", 2);
    EXPECT_FALSE(any_contains(c.warnings, "DEEPSPEED_ELASTICITY_CONFIG"));
  }
  {
    ScopedEnv other(kSchedulerConfigEnv, R"({"enabled": true, "max_train_batch_size": 64,
                    "micro_batch_sizes": [1, 2, 3, 7], "version": 0.1})");
    EXPECT_THROW_WITH(parse("", 2), ElasticityError,
                      "elasticity.max_train_batch_size is 32, but the resource scheduler planned "
                      "with 64 (DEEPSPEED_ELASTICITY_CONFIG)");
  }
  {
    ScopedEnv other(kSchedulerConfigEnv, R"({"enabled": true, "max_train_batch_size": 32,
                    "micro_batch_sizes": [1, 2], "version": 0.1})");
    EXPECT_THROW_WITH(parse("", 2), ElasticityError,
                      "elasticity.micro_batch_sizes is [1, 2, 3, 7], but the resource scheduler "
                      "planned with [1, 2]");
  }
  {
    ScopedEnv other(kSchedulerConfigEnv, R"({"enabled": true, "max_train_batch_size": 32,
                    "micro_batch_sizes": [1, 2, 3, 7], "version": 0.2})");
    EXPECT_THROW_WITH(parse("", 2), ElasticityError, "elasticity.version is 0.1");
  }
  {
    ScopedEnv broken(kSchedulerConfigEnv, "{not json");
    EXPECT_THROW_WITH(parse("", 2), ElasticityError, "DEEPSPEED_ELASTICITY_CONFIG is not JSON");
  }
}

TEST(ElasticityConfig, DisabledSectionLeavesTheTriadAlone) {
  const auto c = DeepSpeedConfig::from_string(
      R"({"train_batch_size": 8, "elasticity": {"enabled": false, "micro_batch_sizes": [3]}})", 2);
  EXPECT_EQ(c.batch.train_batch_size, 8);
  EXPECT_EQ(c.batch.train_micro_batch_size_per_gpu, 4);
  EXPECT_FALSE(any_contains(c.warnings, "Elasticity"));
}

}  // namespace
}  // namespace deepspeed::elasticity
