// python_float_repr against Python 3's repr() of the same doubles.
#include "monitor/python_float.h"

#include <cmath>
#include <limits>

#include <gtest/gtest.h>

namespace deepspeed::monitor::detail {
namespace {

TEST(PythonFloat, MatchesPythonRepr) {
  // (value, repr(value)) pairs printed by CPython 3.11.
  const std::pair<double, const char*> cases[] = {
      {0.1, "0.1"},
      {1e-05, "1e-05"},
      {0.0001, "0.0001"},
      {0.001, "0.001"},
      {100.0, "100.0"},
      {3.0, "3.0"},
      {1e16, "1e+16"},
      {1e15, "1000000000000000.0"},
      {12345678901234567.0, "1.2345678901234568e+16"},
      {123456789.123, "123456789.123"},
      {-2.5, "-2.5"},
      {1.0 / 3.0, "0.3333333333333333"},
      {std::ldexp(1.0, -20), "9.5367431640625e-07"},
      {0.0, "0.0"},
      {-0.0, "-0.0"},
      {1e22, "1e+22"},
      {5e-324, "5e-324"},
      {1.7976931348623157e308, "1.7976931348623157e+308"},
  };
  for (const auto& [value, expected] : cases)
    EXPECT_EQ(python_float_repr(value), expected) << value;
}

TEST(PythonFloat, NonFinite) {
  EXPECT_EQ(python_float_repr(std::numeric_limits<double>::quiet_NaN()), "nan");
  EXPECT_EQ(python_float_repr(std::numeric_limits<double>::infinity()), "inf");
  EXPECT_EQ(python_float_repr(-std::numeric_limits<double>::infinity()), "-inf");
}

}  // namespace
}  // namespace deepspeed::monitor::detail
