// Replays the committed fuzz corpus (tests/fuzz/corpus/config: seeds, the inputs that once
// crashed ds_config, and what the fuzzer found) through the ds_config reader: each input must
// parse or throw deepspeed::Error, never another exception (such as nlohmann's type_error).
#include <filesystem>
#include <fstream>
#include <sstream>
#include <typeinfo>

#include <gtest/gtest.h>

#include "fuzz/config_exercise.h"
#include "support/expect_throw.h"

namespace deepspeed {
namespace {

namespace fs = std::filesystem;

std::string corpus_file(const std::string& name) {
  std::ifstream in(fs::path(DS_CONFIG_CORPUS_DIR) / name, std::ios::binary);
  EXPECT_TRUE(in.good()) << name << " is missing from the corpus";
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void exercise(const std::string& text) {
  fuzz::exercise_config_reader(text, [](const DeepSpeedConfig& c) { c.check_supported(); });
}

TEST(ConfigCorpus, EveryInputParsesOrThrowsDeepSpeedError) {
  size_t inputs = 0, parsed = 0;
  for (const auto& entry : fs::directory_iterator(DS_CONFIG_CORPUS_DIR)) {
    if (!entry.is_regular_file()) continue;
    ++inputs;
    const std::string name = entry.path().filename().string();
    try {
      exercise(corpus_file(name));
      ++parsed;
    } catch (const Error&) {
      // a typed error with a message: what the reader promises
    } catch (const std::exception& e) {
      ADD_FAILURE() << name << ": " << typeid(e).name() << " escaped the reader: " << e.what();
    } catch (...) {
      ADD_FAILURE() << name << ": an unknown exception escaped the reader";
    }
  }
  EXPECT_GE(inputs, 15u) << "the corpus at " << DS_CONFIG_CORPUS_DIR << " looks incomplete";
  EXPECT_GE(parsed, 3u) << "valid configs in the corpus should parse";
}

TEST(ConfigCorpus, FormerCrashersAreConfigErrorsNamingKeyAndType) {
  // These aborted ds_config with an uncaught nlohmann::json type_error 302 (exit 134).
  EXPECT_THROW_WITH(exercise(corpus_file("crash-autotp-size-auto.json")), ConfigError,
                    "ds_config: tensor_parallel.autotp_size is \"auto\"");
  EXPECT_THROW_WITH(exercise(corpus_file("crash-deepcompile-string.json")), ConfigError,
                    "ds_config: compile.deepcompile is \"true\"; expected true or false");
  EXPECT_THROW_WITH(exercise(corpus_file("crash-graph-harvesting-object.json")), ConfigError,
                    "ds_config: graph_harvesting is {\"enabled\":true}; expected true or false");
}

}  // namespace
}  // namespace deepspeed
