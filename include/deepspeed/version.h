// deepspeed-cpp version, and the DeepSpeed version whose behaviour it matches.
#pragma once

namespace deepspeed {
constexpr const char* kVersion = "0.1.0";
/// DeepSpeed release whose config keys, defaults and checkpoint layout this build follows.
constexpr const char* kDeepSpeedCompatVersion = "0.19.6";
}  // namespace deepspeed
