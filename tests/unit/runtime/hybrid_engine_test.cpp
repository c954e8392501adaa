// The hybrid engine (hybrid_engine.enabled) in one process: its section, generate() and
// generate_with(), and the latency line eval() prints as DeepSpeed's does.
#include "deepspeed/deepspeed.h"

#include <algorithm>
#include <chrono>
#include <regex>
#include <string>
#include <thread>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "support/expect_throw.h"
#include "support/tiny_model.h"

namespace deepspeed {
namespace {

json hybrid_config(const json& section) {
  return {{"train_micro_batch_size_per_gpu", 2},
          {"optimizer", {{"type", "SGD"}, {"params", {{"lr", 0.1}}}}},
          {"hybrid_engine", section}};
}

TEST(HybridEngineConfig, ReadsDeepSpeedsSectionAndNamesWhatItLacks) {
  const auto c = DeepSpeedConfig::from_json(hybrid_config({{"enabled", true}}), 1);
  EXPECT_TRUE(c.hybrid_engine.enabled);
  EXPECT_TRUE(c.hybrid_engine.pin_parameters);
  EXPECT_EQ(c.resolved()["hybrid_engine"],
            (json{{"enabled", true}, {"max_out_tokens", 512}, {"inference_tp_size", 1},
                  {"release_inference_cache", false}, {"pin_parameters", true},
                  {"tp_gather_partition_size", 8}, {"enable_cuda_graph", false}}));
  EXPECT_NO_THROW(c.check_supported());
  // Strict, as DeepSpeed's pydantic model.
  EXPECT_THROW_WITH(DeepSpeedConfig::from_json(hybrid_config({{"enabled", true},
                                                              {"pin_parameter", false}}), 1),
                    ConfigError, "hybrid_engine.pin_parameter is not a known key");
  EXPECT_THROW_WITH(
      DeepSpeedConfig::from_json(hybrid_config({{"enabled", true}, {"inference_tp_size", 2}}), 1)
          .check_supported(),
      NotSupportedError, "hybrid_engine.inference_tp_size 2");
  EXPECT_THROW_WITH(
      DeepSpeedConfig::from_json(hybrid_config({{"enabled", true}, {"enable_cuda_graph", true}}),
                                 1)
          .check_supported(),
      NotSupportedError, "hybrid_engine.enable_cuda_graph");
  // Off, nothing is refused.
  EXPECT_NO_THROW(
      DeepSpeedConfig::from_json(hybrid_config({{"inference_tp_size", 2}}), 1).check_supported());
  const auto w = DeepSpeedConfig::from_json(
      hybrid_config({{"enabled", true}, {"release_inference_cache", true}}), 1);
  bool warned = false;
  for (const auto& s : w.warnings) {
    warned = warned || s.find("hybrid_engine.release_inference_cache has no effect") !=
                           std::string::npos;
  }
  EXPECT_TRUE(warned);
}

struct GeneratingNetImpl : testing::TinyNetImpl {
  // Two "tokens": the first layer's output fed through the head, twice.
  torch::Tensor generate(const torch::Tensor& x, int64_t steps) {
    ++calls;
    torch::NoGradGuard no_grad;
    torch::Tensor h = x;
    for (int64_t i = 0; i < steps; ++i) h = torch::tanh(fc1(h)).slice(1, 0, 4);
    return h;
  }
  int calls = 0;
};

TEST(HybridEngine, GenerateCallsTheModulesGenerate) {
  auto model = std::make_shared<GeneratingNetImpl>();
  auto engine = initialize(model, hybrid_config({{"enabled", true}})).engine;
  auto [x, y] = testing::tiny_batch(0, 2);
  const auto out = engine->generate(x, int64_t{3});
  EXPECT_EQ(model->calls, 1);
  EXPECT_TRUE(torch::equal(out, model->generate(x, 3)));
  EXPECT_EQ(engine->generate_with([] { return 7; }), 7);
}

TEST(HybridEngine, GenerationWithoutTheSectionIsAUsageError) {
  auto model = std::make_shared<GeneratingNetImpl>();
  auto engine = initialize(model, hybrid_config({{"enabled", false}})).engine;
  auto [x, y] = testing::tiny_batch(0, 2);
  EXPECT_THROW_WITH(engine->generate(x, int64_t{1}), UsageError,
                    "generation through the engine needs hybrid_engine.enabled");
  EXPECT_EQ(model->calls, 0);
}

double field(const std::string& line, const std::string& name) {
  std::smatch m;
  EXPECT_TRUE(std::regex_search(line, m, std::regex("\\|" + name + "=([0-9.]+)"))) << line;
  return m.size() > 1 ? std::stod(m[1]) : -1;
}

// DeepSpeed-Chat's loop: eval, generate, train some steps, eval again; the second eval prints
// the period's breakdown, generation and training times included.
TEST(HybridEngine, EvalPrintsTheLatencyBreakdown) {
  auto model = std::make_shared<GeneratingNetImpl>();
  auto engine = initialize(model, hybrid_config({{"enabled", true}})).engine;
  auto [x, y] = testing::tiny_batch(0, 2);
  ::testing::internal::CaptureStdout();
  engine->eval();  // starts the first period: nothing to print yet
  engine->generate_with([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(60));
    return model->generate(x, 1);
  }, 2);
  engine->train();
  for (int i = 0; i < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(40));
    engine->backward(engine->forward(x, y));
    engine->step();
  }
  engine->eval();
  const std::string out = ::testing::internal::GetCapturedStdout();
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex("\\[deepspeed\\] (\\|E2E latency=.*)")))
      << out;
  const std::string line = m[1];
  EXPECT_EQ(out.find("E2E latency", out.find("E2E latency") + 1), std::string::npos)
      << "one line only: " << out;
  const double e2e = field(line, "E2E latency");
  EXPECT_EQ(field(line, "Gather latency"), 0.0);  // no ZeRO-3: nothing gathered
  EXPECT_GE(field(line, "Generate time"), 0.06);
  EXPECT_GE(field(line, "Training time"), 0.08);
  EXPECT_GE(e2e, 0.14);
  // The latency is printed to 0.01 s and the rates come from the unrounded one: a rate must
  // lie in what the rounding interval of the latency allows (to its own 0.01 of rounding).
  for (const char* rate : {"CurSamplesPerSec", "AvgSamplesPerSec"}) {
    EXPECT_GE(field(line, rate), 2 / (e2e + 0.005) - 0.005) << rate << " in " << line;
    EXPECT_LE(field(line, rate), 2 / (e2e - 0.005) + 0.005) << rate << " in " << line;
  }
}

}  // namespace
}  // namespace deepspeed
