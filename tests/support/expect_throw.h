// EXPECT_THROW_WITH(expr, ErrorType, "substring"): the error path is tested by its text.
#pragma once

#include <string>

#include <gtest/gtest.h>

#define EXPECT_THROW_WITH(expr, ErrorType, substring)                                         \
  do {                                                                                       \
    try {                                                                                    \
      (void)(expr);                                                                          \
      ADD_FAILURE() << "expected " #ErrorType " containing \"" << (substring)                \
                    << "\" from: " #expr;                                                    \
    } catch (const ErrorType& e) {                                                           \
      EXPECT_NE(std::string(e.what()).find(substring), std::string::npos)                    \
          << "message was: " << e.what();                                                    \
    }                                                                                        \
  } while (0)
