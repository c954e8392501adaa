// The batch triad: DeepSpeed's inference table and error cases (reference §1.2, Appendix A.6).
#include "config/batch_config.h"

#include <gtest/gtest.h>

#include "support/expect_throw.h"

namespace deepspeed {
namespace {

using config_detail::resolve_batch_triad;
using std::nullopt;

TEST(BatchTriad, AnyTwoOfThreeInferTheThird_WorldSize2) {
  // DeepSpeed's test_ds_config_dict cases (32,16,1) and (32,8,2) succeed for every subset.
  for (auto [tb, mb, gas] : {std::tuple{32, 16, 1}, std::tuple{32, 8, 2}}) {
    auto check = [&](BatchConfig b) {
      EXPECT_EQ(b.train_batch_size, tb);
      EXPECT_EQ(b.train_micro_batch_size_per_gpu, mb);
      EXPECT_EQ(b.gradient_accumulation_steps, gas);
    };
    check(resolve_batch_triad(tb, mb, gas, 2, "cfg"));
    check(resolve_batch_triad(tb, mb, nullopt, 2, "cfg"));
    check(resolve_batch_triad(tb, nullopt, gas, 2, "cfg"));
    check(resolve_batch_triad(nullopt, mb, gas, 2, "cfg"));
  }
}

TEST(BatchTriad, WorkedExamplesWorldSize8) {
  auto b = resolve_batch_triad(256, 4, nullopt, 8, "cfg");
  EXPECT_EQ(b.gradient_accumulation_steps, 8);
  b = resolve_batch_triad(256, nullopt, nullopt, 8, "cfg");
  EXPECT_EQ(b.gradient_accumulation_steps, 1);
  EXPECT_EQ(b.train_micro_batch_size_per_gpu, 32);
  b = resolve_batch_triad(nullopt, 4, 3, 8, "cfg");
  EXPECT_EQ(b.train_batch_size, 96);
  b = resolve_batch_triad(nullopt, 4, nullopt, 8, "cfg");
  EXPECT_EQ(b.train_batch_size, 32);
  EXPECT_EQ(b.gradient_accumulation_steps, 1);
}

TEST(BatchTriad, MismatchNamesAllThreeValues) {
  // {TB: 100, MB: 4} at W=8 -> GAS = 25 // 8 = 3 -> 100 != 4 * 3 * 8.
  EXPECT_THROW_WITH(resolve_batch_triad(100, 4, nullopt, 8, "ds_config.json"), ConfigError,
                    "ds_config.json: train_batch_size (100) != train_micro_batch_size_per_gpu (4)"
                    " * gradient_accumulation_steps (3) * data-parallel size (8) = 96");
  EXPECT_THROW_WITH(resolve_batch_triad(33, 17, 2, 2, "cfg"), ConfigError, "!=");
}

TEST(BatchTriad, DerivedZeroIsRejected) {
  // (32, 18, -) at W=2: GAS = 32 // 18 // 2 = 0.
  EXPECT_THROW_WITH(resolve_batch_triad(32, 18, nullopt, 2, "cfg"), ConfigError,
                    "gradient_accumulation_steps is 0 (derived as");
  EXPECT_THROW_WITH(resolve_batch_triad(0, nullopt, nullopt, 1, "cfg"), ConfigError,
                    "train_batch_size is 0");
  EXPECT_THROW_WITH(resolve_batch_triad(8, 0, 1, 1, "cfg"), ConfigError,
                    "train_micro_batch_size_per_gpu is 0; it has to be greater than 0");
}

TEST(BatchTriad, GivenZeroDivisorIsAnErrorNotACrash) {
  // These divided by zero (SIGFPE; found by the config fuzzer).
  EXPECT_THROW_WITH(resolve_batch_triad(16, nullopt, 0, 1, "cfg"), ConfigError,
                    "cfg: gradient_accumulation_steps is 0; it has to be greater than 0");
  EXPECT_THROW_WITH(resolve_batch_triad(16, 0, nullopt, 2, "cfg"), ConfigError,
                    "cfg: train_micro_batch_size_per_gpu is 0; it has to be greater than 0");
  EXPECT_THROW_WITH(resolve_batch_triad(16, -2, nullopt, 2, "cfg"), ConfigError,
                    "train_micro_batch_size_per_gpu is -2");
}

TEST(BatchTriad, NeedsBatchOrMicroBatch) {
  EXPECT_THROW_WITH(resolve_batch_triad(nullopt, nullopt, 4, 1, "cfg"), ConfigError,
                    "either train_batch_size or train_micro_batch_size_per_gpu");
  EXPECT_THROW_WITH(resolve_batch_triad(nullopt, nullopt, nullopt, 1, "cfg"), ConfigError,
                    "either train_batch_size");
}

TEST(BatchTriad, ProductPastInt64IsAnError) {
  EXPECT_THROW_WITH(resolve_batch_triad(nullopt, int64_t{1} << 62, 4, 1, "cfg"), ConfigError,
                    "does not fit in 64 bits");
  EXPECT_THROW_WITH(resolve_batch_triad(8, int64_t{1} << 62, 1, 4, "cfg"), ConfigError,
                    "does not fit in 64 bits");
}

// "auto" (Hugging Face's placeholder) in the triad: resolved when the other keys determine it.
DeepSpeedConfig parse(const std::string& text, int64_t world) {
  return DeepSpeedConfig::from_string(text, world);
}

TEST(BatchTriadAuto, OneAutoKeyIsResolvedFromTheOthersWithANote) {
  auto c = parse(R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": 4,
                     "gradient_accumulation_steps": 2})", 4);
  EXPECT_EQ(c.batch.train_batch_size, 32);
  ASSERT_EQ(c.notes.size(), 1u);
  EXPECT_EQ(c.notes[0], "ds_config: train_batch_size: \"auto\" resolved to 32 = micro 4 x "
                        "accum 2 x world 4 (the batch triad determines it)");
  EXPECT_EQ(c.resolved()["train_batch_size"], 32);  // never "auto" once resolved

  c = parse(R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": "auto",
                "gradient_accumulation_steps": 2})", 4);
  EXPECT_EQ(c.batch.train_micro_batch_size_per_gpu, 4);
  ASSERT_EQ(c.notes.size(), 1u);
  EXPECT_EQ(c.notes[0], "ds_config: train_micro_batch_size_per_gpu: \"auto\" resolved to 4 = "
                        "train_batch_size 32 / (accum 2 x world 4) (the batch triad determines it)");

  c = parse(R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4,
                "gradient_accumulation_steps": "auto"})", 4);
  EXPECT_EQ(c.batch.gradient_accumulation_steps, 2);
  ASSERT_EQ(c.notes.size(), 1u);
  EXPECT_EQ(c.notes[0], "ds_config: gradient_accumulation_steps: \"auto\" resolved to 2 = "
                        "train_batch_size 32 / (micro 4 x world 4) (the batch triad determines it)");
  EXPECT_EQ(c.resolved()["gradient_accumulation_steps"], 2);

  // Accumulation absent reads as 1, as DeepSpeed does without "auto".
  c = parse(R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": 4})", 2);
  EXPECT_EQ(c.batch.train_batch_size, 8);
  ASSERT_EQ(c.notes.size(), 1u);
  EXPECT_NE(c.notes[0].find("= micro 4 x accum 1 (the default when it is not given) x world 2"),
            std::string::npos) << c.notes[0];
}

TEST(BatchTriadAuto, UnderdeterminedAutoIsRefusedNamingTheKey) {
  // The old message ("either ... needs to be provided") while both keys were there.
  EXPECT_THROW_WITH(parse(R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
                             "gradient_accumulation_steps": "auto"})", 1),
                    ConfigError,
                    "ds_config: train_batch_size, train_micro_batch_size_per_gpu and "
                    "gradient_accumulation_steps are \"auto\"; \"auto\" is a placeholder that the "
                    "Hugging Face integration fills in");
  EXPECT_THROW_WITH(parse(R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
                             "gradient_accumulation_steps": 2})", 1),
                    ConfigError, "train_batch_size and train_micro_batch_size_per_gpu are \"auto\"");
  EXPECT_THROW_WITH(parse(R"({"train_batch_size": "auto", "gradient_accumulation_steps": 2})", 1),
                    ConfigError,
                    "ds_config: train_batch_size is \"auto\"; \"auto\" is a placeholder that the "
                    "Hugging Face integration fills in before DeepSpeed reads the config, and "
                    "this build reads the config as written: give an integer here (it cannot be "
                    "derived: train_micro_batch_size_per_gpu is not a number)");
  EXPECT_THROW_WITH(parse(R"({"train_micro_batch_size_per_gpu": "auto"})", 1), ConfigError,
                    "train_micro_batch_size_per_gpu is \"auto\"");
  // Accumulation "auto" has no default once written: it needs both other keys.
  EXPECT_THROW_WITH(parse(R"({"train_batch_size": 32, "gradient_accumulation_steps": "auto"})", 1),
                    ConfigError,
                    "gradient_accumulation_steps is \"auto\"; \"auto\" is a placeholder");
  // A resolved value still meets DeepSpeed's checks (floor division, then the product).
  EXPECT_THROW_WITH(parse(R"({"train_batch_size": 30, "train_micro_batch_size_per_gpu": "auto",
                             "gradient_accumulation_steps": 2})", 4),
                    ConfigError, "train_batch_size (30) != train_micro_batch_size_per_gpu (3)");
}

}  // namespace
}  // namespace deepspeed
