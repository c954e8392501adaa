// expect_usage_error(): the launcher's error-path assertion, by message text (UsageError).
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "usage_error.h"

namespace deepspeed::launcher::testing {

// Runs `fn`; fails unless it throws UsageError whose message contains every fragment.
template <typename Fn>
void expect_usage_error(Fn&& fn, const std::vector<std::string>& fragments) {
  try {
    fn();
    ADD_FAILURE() << "expected UsageError containing '" << (fragments.empty() ? "" : fragments[0]) << "'";
  } catch (const UsageError& e) {
    for (const auto& fragment : fragments) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos)
          << "message '" << e.what() << "' lacks '" << fragment << "'";
    }
  }
}

}  // namespace deepspeed::launcher::testing
