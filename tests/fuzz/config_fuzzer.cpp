// libFuzzer target for the ds_config.json reader. Every input must parse or throw
// deepspeed::Error; any other exception escapes and aborts, which libFuzzer reports as a crash
// (as do ASan and UBSan findings). Found inputs belong in corpus/config/, which CI replays.
#include <cstddef>
#include <cstdint>
#include <string>

#include "config/feature_sections.h"
#include "config_exercise.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    deepspeed::fuzz::exercise_config_reader(text, [](const deepspeed::DeepSpeedConfig& c) {
      deepspeed::config_detail::check_features_supported(c);
    });
  } catch (const deepspeed::Error&) {
    // the reader's promise: a clear, typed error
  }
  return 0;
}
