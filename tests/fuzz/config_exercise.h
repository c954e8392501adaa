// What the config fuzzer and the corpus replay test do with one input: what ds_config does with
// a file (parse for two world sizes, judge the features, resolve "auto" sizes, print the
// resolved config). The contract: it returns, or throws deepspeed::Error; nothing else.
#pragma once

#include <string>

#include "config/auto_sizes.h"
#include "deepspeed/config.h"

namespace deepspeed::fuzz {

/// `check` judges the parsed config: DeepSpeedConfig::check_supported() where the optimizer
/// code is linked, config_detail::check_features_supported() in the LibTorch-free fuzzer.
template <typename Check>
void exercise_config_reader(const std::string& text, Check check) {
  for (int64_t world : {1, 3}) {
    DeepSpeedConfig c = DeepSpeedConfig::from_string(text, world);
    check(c);
    (void)c.resolved().dump();
    if (!c.zero_optimization.auto_sizes.empty()) {
      config_detail::resolve_auto_sizes(c, 64, "hidden size 64 for the test");
      (void)c.resolved().dump();
    }
  }
}

}  // namespace deepspeed::fuzz
