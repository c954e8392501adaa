// Loading ds_config from a file, JSON text, or base64; comments; duplicate keys.
#include "config/config_source.h"

#include <gtest/gtest.h>

#include "support/expect_throw.h"
#include "support/temp_dir.h"

namespace deepspeed {
namespace {

using config_detail::load_config_text;

TEST(ConfigSource, ReadsFileWithComments) {
  testing::TempDir dir;
  std::string path = dir.file("ds_config.json");
  testing::write_text_file(path, "{\n  // micro batch\n  \"train_micro_batch_size_per_gpu\": 4\n}\n");
  auto loaded = load_config_text(path);
  EXPECT_EQ(loaded.source, path);
  EXPECT_EQ(loaded.doc["train_micro_batch_size_per_gpu"], 4);
}

TEST(ConfigSource, AcceptsJsonTextAndBase64) {
  EXPECT_EQ(load_config_text("{\"a\": 1}").doc["a"], 1);
  // base64url of {"train_batch_size": 8}
  EXPECT_EQ(load_config_text("eyJ0cmFpbl9iYXRjaF9zaXplIjogOH0=").doc["train_batch_size"], 8);
}

TEST(ConfigSource, DuplicateKeysAreNamed) {
  EXPECT_THROW_WITH(load_config_text("{\"fp16\": {\"enabled\": true, \"enabled\": false}}"),
                    ConfigError, "duplicate keys in DeepSpeed config: [enabled]");
}

TEST(ConfigSource, MissingFileAndBadJson) {
  EXPECT_THROW_WITH(load_config_text("/nonexistent/ds_config.json"), ConfigError,
                    "/nonexistent/ds_config.json");
  testing::TempDir dir;
  std::string path = dir.file("bad.json");
  testing::write_text_file(path, "{\"train_batch_size\": 8,,}");
  EXPECT_THROW_WITH(load_config_text(path), ConfigError, "bad.json: not valid JSON");
  testing::write_text_file(path, "[1, 2]");
  EXPECT_THROW_WITH(load_config_text(path), ConfigError, "top level must be a JSON object");
  // A number past double's range: nlohmann's out_of_range, found by the fuzzer.
  EXPECT_THROW_WITH(load_config_text(R"({"gradient_clipping": 1e400})"), ConfigError,
                    "ds_config: not valid JSON: [json.exception.out_of_range.406] number overflow");
}

TEST(ConfigSource, Base64DecodesLongInputs) {
  // Decoding once shifted an int past its range after a few characters (UBSan, the fuzzer).
  const std::string text = R"({"train_batch_size": 8, "gradient_accumulation_steps": 1})";
  EXPECT_EQ(load_config_text("eyJ0cmFpbl9iYXRjaF9zaXplIjogOCwgImdyYWRpZW50X2FjY3VtdWxhdGlvbl9zdGVwcyI6IDF9")
                .doc,
            json::parse(text));
}

}  // namespace
}  // namespace deepspeed
