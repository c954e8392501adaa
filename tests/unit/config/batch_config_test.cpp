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

TEST(BatchTriad, NeedsBatchOrMicroBatch) {
  EXPECT_THROW_WITH(resolve_batch_triad(nullopt, nullopt, 4, 1, "cfg"), ConfigError,
                    "either train_batch_size or train_micro_batch_size_per_gpu");
  EXPECT_THROW_WITH(resolve_batch_triad(nullopt, nullopt, nullopt, 1, "cfg"), ConfigError,
                    "either train_batch_size");
}

}  // namespace
}  // namespace deepspeed
