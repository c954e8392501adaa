// The profiler's number formatting against DeepSpeed's helpers (values printed by Python).
#include "profiling/number_format.h"

#include <gtest/gtest.h>

namespace deepspeed::profiling::detail {
namespace {

TEST(NumberFormat, MatchesDeepSpeedHelpers) {
  EXPECT_EQ(number_to_string(1.2345e9), "1.23 G");
  EXPECT_EQ(number_to_string(0), "0 ");
  EXPECT_EQ(number_to_string(512), "512 ");
  EXPECT_EQ(number_to_string(2.5e12), "2.5 T");
  EXPECT_EQ(number_to_string(0.0452), "45.2 m");
  EXPECT_EQ(number_to_string(3e-6), "3 u");
  EXPECT_EQ(macs_to_string(1.06e9), "1.06 GMACs");
  EXPECT_EQ(flops_to_string(47.125e9), "47.12 GFLOPS");  // round() ties to even
  EXPECT_EQ(flops_to_string(47.126e9), "47.13 GFLOPS");
  EXPECT_EQ(params_to_string(8.39e6), "8.39 M");
  EXPECT_EQ(params_to_string(1.5e9), "1.5 B");
  EXPECT_EQ(params_to_string(0), "0");
  EXPECT_EQ(duration_to_string(0.0452), "45.2 ms");
  EXPECT_EQ(duration_to_string(1.0), "1 s");
  EXPECT_EQ(rounded_g(100.0), "100");
  EXPECT_EQ(rounded_g(12.345678), "12.35");
}

}  // namespace
}  // namespace deepspeed::profiling::detail
