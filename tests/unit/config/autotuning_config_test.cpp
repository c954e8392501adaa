// The autotuning section: DeepSpeed's keys and defaults, the resolved config, and bad keys and
// values as errors that name the key.
#include "deepspeed/autotuning_config.h"
#include "deepspeed/config.h"

#include <gtest/gtest.h>

#include "support/expect_throw.h"

namespace deepspeed {
namespace {

DeepSpeedConfig parse(const std::string& text) { return DeepSpeedConfig::from_string(text, 1); }

TEST(AutotuningConfig, DefaultsMatchDeepSpeed) {
  const AutotuningConfig a = AutotuningConfig::of(parse(R"({"train_batch_size": 4})"));
  EXPECT_FALSE(a.enabled);
  EXPECT_TRUE(a.fast);
  EXPECT_EQ(a.results_dir, "autotuning_results");
  EXPECT_EQ(a.exps_dir, "autotuning_exps");
  EXPECT_TRUE(a.overwrite);
  EXPECT_EQ(a.start_profile_step, 3);
  EXPECT_EQ(a.end_profile_step, 5);
  EXPECT_EQ(a.metric, "throughput");
  EXPECT_EQ(a.tuner_type, "gridsearch");
  EXPECT_EQ(a.tuner_early_stopping, 5);
  EXPECT_EQ(a.tuner_num_trials, 50);
  EXPECT_FALSE(a.max_train_batch_size.has_value());
  EXPECT_EQ(a.min_train_batch_size, 1);
  EXPECT_EQ(a.max_train_micro_batch_size_per_gpu, 1024);
  EXPECT_EQ(a.min_train_micro_batch_size_per_gpu, 1);
  EXPECT_EQ(a.num_tuning_micro_batch_sizes, 3);
  EXPECT_EQ(a.mp_size, 1);
  EXPECT_FALSE(a.model_info.has_value());
  EXPECT_EQ(a.metric_file(), "autotuning_metric.json");
  EXPECT_EQ(a.model_info_file(), "autotuning_model_info.json");
  const json r = parse(R"({"train_batch_size": 4})").resolved();
  EXPECT_EQ(r["autotuning"]["end_profile_step"], 5);
  EXPECT_TRUE(r["autotuning"]["max_train_batch_size"].is_null());
}

TEST(AutotuningConfig, EnabledIsAcceptedAndEveryKeyRead) {
  const auto c = parse(R"({"train_batch_size": 4, "autotuning": {"enabled": true, "fast": false,
      "results_dir": "r", "exps_dir": "e", "overwrite": false, "start_profile_step": 2,
      "end_profile_step": 4, "metric": "latency", "metric_path": "m.json", "tuner_type": "model_based",
      "tuner_early_stopping": 3, "tuner_num_trials": 7, "arg_mappings": {"train_micro_batch_size_per_gpu": "--mbs"},
      "max_train_batch_size": 64, "min_train_batch_size": 2, "max_train_micro_batch_size_per_gpu": 16,
      "min_train_micro_batch_size_per_gpu": 2, "num_tuning_micro_batch_sizes": 4, "mp_size": 1,
      "model_info": {"profile": true, "num_params": 100, "hidden_size": 8, "num_layers": 2},
      "model_info_path": "info.json"}})");
  EXPECT_NO_THROW(c.check_supported());
  const AutotuningConfig a = AutotuningConfig::of(c);
  EXPECT_TRUE(a.enabled);
  EXPECT_FALSE(a.fast);
  EXPECT_EQ(a.metric, "latency");
  EXPECT_EQ(a.tuner_type, "model_based");
  EXPECT_EQ(a.arg_mappings.at("train_micro_batch_size_per_gpu"), "--mbs");
  EXPECT_EQ(*a.max_train_batch_size, 64);
  EXPECT_EQ(a.num_tuning_micro_batch_sizes, 4);
  ASSERT_TRUE(a.model_info.has_value());
  EXPECT_TRUE(a.profile_model_info());
  EXPECT_EQ(*a.model_info->num_params, 100);
  EXPECT_EQ(a.metric_file(), "m.json");
  EXPECT_EQ(a.model_info_file(), "info.json");
  EXPECT_EQ(c.resolved()["autotuning"]["model_info"]["hidden_size"], 8);
}

TEST(AutotuningConfig, BadKeysAndValuesNameTheKey) {
  EXPECT_THROW_WITH(parse(R"({"train_batch_size": 4, "autotuning": {"enabled": true, "fats": true}})"),
                    ConfigError, "autotuning.fats is not a known key; did you mean 'fast'?");
  EXPECT_THROW_WITH(parse(R"({"train_batch_size": 4, "autotuning": {"metric": "speed"}})"), ConfigError,
                    "autotuning.metric is \"speed\"; expected one of throughput, latency, flops");
  EXPECT_THROW_WITH(parse(R"({"train_batch_size": 4, "autotuning": {"tuner_type": "bayes"}})"), ConfigError,
                    "autotuning.tuner_type is \"bayes\"; expected one of gridsearch, random, model_based");
  EXPECT_THROW_WITH(parse(R"({"train_batch_size": 4, "autotuning": {"start_profile_step": 6}})"), ConfigError,
                    "autotuning.end_profile_step is 5; expected at least start_profile_step (6)");
  EXPECT_THROW_WITH(parse(R"({"train_batch_size": 4, "autotuning": {"max_train_micro_batch_size_per_gpu": 0}})"),
                    ConfigError, "autotuning.max_train_micro_batch_size_per_gpu is 0; expected an integer >= 1");
  EXPECT_THROW_WITH(parse(R"({"train_batch_size": 4, "autotuning": {"min_train_micro_batch_size_per_gpu": 8,
                    "max_train_micro_batch_size_per_gpu": 4}})"),
                    ConfigError, "autotuning.max_train_micro_batch_size_per_gpu is 4; expected at least");
  EXPECT_THROW_WITH(parse(R"({"train_batch_size": 4, "autotuning": {"arg_mappings": {"x": 3}}})"), ConfigError,
                    "autotuning.arg_mappings entry 'x' is 3");
  EXPECT_THROW_WITH(parse(R"({"train_batch_size": 4, "autotuning": {"model_info": {"num_param": 3}}})"),
                    ConfigError, "autotuning.model_info.num_param is not a known key; did you mean 'num_params'?");
  EXPECT_THROW_WITH(parse(R"({"train_batch_size": 4, "autotuning": {"fast": "yes"}})"), ConfigError,
                    "autotuning.fast is \"yes\"; expected true or false");
  EXPECT_THROW_WITH(parse(R"({"train_batch_size": 4, "autotuning": {"results_dir": ""}})"), ConfigError,
                    "autotuning.results_dir is empty");
  EXPECT_THROW_WITH(parse(R"({"train_batch_size": 4, "autotuning": 3})"), ConfigError,
                    "autotuning is 3; expected an object");
}

}  // namespace
}  // namespace deepspeed
