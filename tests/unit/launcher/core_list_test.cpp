// Tests for --bind_core_list parsing and formatting (tools/deepspeed/core_list.cpp).
#include "core_list.h"

#include <gtest/gtest.h>

#include "usage_error.h"

namespace deepspeed::launcher {
namespace {

TEST(CoreList, ParsesDeepSpeedSyntax) {
  EXPECT_EQ(parse_core_list("1,3-5,7"), (std::vector<int>{1, 3, 4, 5, 7}));
  EXPECT_EQ(parse_core_list("0"), (std::vector<int>{0}));
  EXPECT_EQ(parse_core_list(" 2 - 3 , 0 "), (std::vector<int>{2, 3, 0})) << "order kept, blanks ignored";
  EXPECT_EQ(parse_core_list("1,1,0-1"), (std::vector<int>{1, 0})) << "repeats dropped";
}

TEST(CoreList, RejectsMalformedItemsNamingThem) {
  for (const char* bad : {"", "1,,2", "a", "1-", "-1", "3-1", "1.5"}) {
    try {
      parse_core_list(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("--bind_core_list"), std::string::npos) << e.what();
    }
  }
}

TEST(CoreList, FormatsRanges) {
  EXPECT_EQ(format_core_list({0, 1, 2, 5, 7, 8}), "0-2,5,7-8");
  EXPECT_EQ(format_core_list({}), "");
  EXPECT_EQ(format_core_list({4}), "4");
}

}  // namespace
}  // namespace deepspeed::launcher
