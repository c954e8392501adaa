// "auto" ZeRO sizes: the hidden size read off the model's 2-D parameters and Hugging Face's
// formulas, with a note each; the resolved config never shows "auto".
#include "config/auto_sizes.h"

#include <gtest/gtest.h>

#include "support/expect_throw.h"

namespace deepspeed {
namespace {

using config_detail::hidden_size_of;
using config_detail::resolve_auto_sizes_from_model;

DeepSpeedConfig zero3_auto() {
  return DeepSpeedConfig::from_string(R"({"train_batch_size": 8, "zero_optimization": {
      "stage": 3, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
      "stage3_param_persistence_threshold": "auto"}})", 1);
}

TEST(AutoSizes, HiddenSizeIsTheMostCommonDimensionOf2DParameters) {
  // A GPT-2 block with hidden 768: embeddings, qkv, projections, MLP; 1-D biases ignored.
  EXPECT_EQ(hidden_size_of({{50257, 768}, {1024, 768}, {768, 2304}, {2304}, {768, 768},
                            {768, 3072}, {3072, 768}, {768}}),
            768);
  EXPECT_EQ(hidden_size_of({{4, 8}}), 8);  // a tie goes to the larger dimension
  EXPECT_FALSE(hidden_size_of({{10}, {3, 4, 5}}).has_value());
}

TEST(AutoSizes, FilledFromTheModelWithHuggingFacesFormulasAndANoteEach) {
  auto c = zero3_auto();
  ASSERT_EQ(c.zero_optimization.auto_sizes.size(), 3u);
  EXPECT_TRUE(c.notes.empty());
  resolve_auto_sizes_from_model(c, {{1000, 64}, {64, 64}, {64, 256}, {256, 64}});
  EXPECT_EQ(c.zero_optimization.reduce_bucket_size, 64 * 64);
  EXPECT_EQ(c.zero_optimization.stage3_prefetch_bucket_size, 3686);  // int(0.9 * 4096)
  EXPECT_EQ(c.zero_optimization.stage3_param_persistence_threshold, 640);
  EXPECT_TRUE(c.zero_optimization.auto_sizes.empty());
  ASSERT_EQ(c.notes.size(), 3u);
  EXPECT_EQ(c.notes[0],
            "ds_config: zero_optimization.reduce_bucket_size: \"auto\" resolved to 4096 = "
            "hidden_size^2 with hidden_size 64 (the most common dimension of the model's 2-D "
            "parameters), as the Hugging Face integration fills it");
  EXPECT_NE(c.notes[1].find("stage3_prefetch_bucket_size: \"auto\" resolved to 3686 = 0.9 x "
                            "hidden_size^2"), std::string::npos) << c.notes[1];
  EXPECT_NE(c.notes[2].find("stage3_param_persistence_threshold: \"auto\" resolved to 640 = 10 x "
                            "hidden_size"), std::string::npos) << c.notes[2];
  EXPECT_EQ(c.resolved()["zero_optimization"]["reduce_bucket_size"], 4096);
}

TEST(AutoSizes, UnresolvedSizesShowTheirFormulaNotAuto) {
  auto c = zero3_auto();
  const json z = c.resolved()["zero_optimization"];
  EXPECT_EQ(z["reduce_bucket_size"], "hidden_size^2 (set from the model at initialize)");
  EXPECT_EQ(z["stage3_param_persistence_threshold"],
            "10 x hidden_size (set from the model at initialize)");
  EXPECT_EQ(z.dump().find("auto"), std::string::npos) << z.dump();
}

TEST(AutoSizes, AliasAndModelWithoutMatricesAreErrors) {
  auto c = DeepSpeedConfig::from_string(R"({"train_batch_size": 8, "zero_optimization": {
      "stage": 3, "prefetch_bucket_size": "auto"}})", 1);
  EXPECT_EQ(c.zero_optimization.auto_sizes, std::vector<std::string>{"stage3_prefetch_bucket_size"});
  EXPECT_THROW_WITH(resolve_auto_sizes_from_model(c, {{10}}), ConfigError,
                    "zero_optimization.stage3_prefetch_bucket_size is \"auto\"");
  EXPECT_THROW_WITH(DeepSpeedConfig::from_string(R"({"train_batch_size": 8, "zero_optimization": {
      "stage3_prefetch_bucket_size": "auto", "prefetch_bucket_size": 5}})", 1),
                    ConfigError, "alias 'prefetch_bucket_size' are both set");
  auto d = zero3_auto();
  EXPECT_THROW_WITH(config_detail::resolve_auto_sizes(d, int64_t{1} << 40, "--hidden-size"),
                    ConfigError, "expected 1 to 3037000499");
}

}  // namespace
}  // namespace deepspeed
