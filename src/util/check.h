// DS_CHECK / DS_INTERNAL_ASSERT: the two tiers of error handling (after c10's TORCH_CHECK).
// DS_CHECK(cond, ErrorType, parts...) is for user, config and input errors;
// DS_INTERNAL_ASSERT(cond, parts...) is for broken invariants and says so.
#pragma once

#include <sstream>
#include <string>

#include "deepspeed/errors.h"

namespace deepspeed::detail {

template <typename... Parts>
std::string str_cat(const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}

}  // namespace deepspeed::detail

#define DS_CHECK(cond, ErrorType, ...)                                   \
  do {                                                                   \
    if (!(cond)) {                                                       \
      throw ErrorType(::deepspeed::detail::str_cat(__VA_ARGS__));        \
    }                                                                    \
  } while (0)

#define DS_INTERNAL_ASSERT(cond, ...)                                                        \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      throw ::deepspeed::Error(::deepspeed::detail::str_cat(                                 \
          "internal assertion failed at " __FILE__ ":", __LINE__, ": " #cond ": ",           \
          ##__VA_ARGS__, " (this is a bug in deepspeed-cpp; please report it)"));            \
    }                                                                                        \
  } while (0)
