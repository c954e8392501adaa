// The engine's observability wiring: tensorboard and csv series written at each step with
// DeepSpeed's names and steps, the step log line, the wall-clock timers covering the step, and
// the flops profiler report at profile_step.
#include "deepspeed/deepspeed.h"

#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "monitor/event_file_format.h"
#include "support/temp_dir.h"
#include "support/tiny_model.h"

namespace deepspeed {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;
using testing::TinyNetImpl;
using testing::tiny_batch;

json observed_config(const std::string& dir) {
  return json{{"train_micro_batch_size_per_gpu", 2},
              {"gradient_accumulation_steps", 2},
              {"steps_per_print", 1},
              {"wall_clock_breakdown", true},
              {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.01}}}}},
              {"tensorboard", {{"enabled", true}, {"output_path", dir}, {"job_name", "tb"}}},
              {"csv_monitor", {{"enabled", true}, {"output_path", dir}, {"job_name", "csv"}}},
              {"flops_profiler", {{"enabled", true}, {"profile_step", 1},
                                  {"output_file", dir + "/flops.txt"}}}};
}

TEST(EngineObservability, MonitorsProfilerAndStepLog) {
  TempDir dir;
  auto model = std::make_shared<TinyNetImpl>();
  auto [engine, optimizer, sched] = initialize(model, observed_config(dir.path()));
  engine->set_tokens_per_sample(4);
  std::vector<double> losses;
  ::testing::internal::CaptureStderr();
  ::testing::internal::CaptureStdout();
  for (int s = 0; s < 3; ++s) {
    double sum = 0.0;
    for (int m = 0; m < 2; ++m) {
      auto [x, y] = tiny_batch((s * 2 + m) * 2, 2);
      sum += engine->backward(engine->forward(x, y)).item<double>();
      engine->step();
    }
    losses.push_back(sum);
    EXPECT_DOUBLE_EQ(engine->last_loss(), sum);
    // The timers cover the step: backward contains its inner part, all are positive.
    auto timers = engine->get_wall_clock_timers();
    std::map<std::string, double> t(timers.begin(), timers.end());
    EXPECT_GT(t["fwd"], 0.0);
    EXPECT_GE(t["bwd"], t["bwd_inner"]);
    EXPECT_GT(t["step"], 0.0);
  }
  const std::string log = ::testing::internal::GetCapturedStderr() +
                          ::testing::internal::GetCapturedStdout();
  EXPECT_NE(log.find("step 3 | samples 12 | loss"), std::string::npos) << log;
  EXPECT_NE(log.find("| grad_norm "), std::string::npos) << log;
  EXPECT_NE(log.find("| tokens/s "), std::string::npos) << log;

  // TensorBoard: train_loss at the samples before each step, lr after it.
  std::string event_file;
  for (auto& e : fs::directory_iterator(dir.file("tb"))) event_file = e.path().string();
  ASSERT_FALSE(event_file.empty());
  std::vector<std::pair<int64_t, double>> loss_events, lr_events, fwd_events;
  for (const auto& r : monitor::detail::read_event_file(event_file)) {
    for (const auto& v : r.values) {
      if (v.tag == "Train/Samples/train_loss") loss_events.emplace_back(r.step, v.simple_value);
      if (v.tag == "Train/Samples/lr") lr_events.emplace_back(r.step, v.simple_value);
      if (v.tag == "Train/Samples/elapsed_time_ms_forward") fwd_events.emplace_back(r.step, v.simple_value);
    }
  }
  ASSERT_EQ(loss_events.size(), 3u);
  ASSERT_EQ(lr_events.size(), 3u);
  EXPECT_EQ(fwd_events.size(), 3u);
  for (int s = 0; s < 3; ++s) {
    EXPECT_EQ(loss_events[s].first, s * 4);
    EXPECT_NEAR(loss_events[s].second, losses[s], 1e-6 * std::abs(losses[s]));
    EXPECT_EQ(lr_events[s].first, (s + 1) * 4);
    EXPECT_NEAR(lr_events[s].second, 0.01, 1e-9);
  }
  // CSV: one file per series.
  std::ifstream csv(dir.file("csv/Train_Samples_train_loss.csv"));
  ASSERT_TRUE(csv.good());
  std::string header, first;
  std::getline(csv, header);
  std::getline(csv, first);
  EXPECT_EQ(first.rfind("0,", 0), 0u) << first;
  // The flops profile of step 1 went to its output_file.
  std::ifstream flops(dir.file("flops.txt"));
  std::stringstream text;
  text << flops.rdbuf();
  EXPECT_NE(text.str().find("params"), std::string::npos) << text.str();
}

// wall_clock_breakdown + memory_breakdown + the throughput timer, through the engine: DeepSpeed's
// line shapes, its warm-up (no throughput line at step 2) and steps_per_print cadence (step 4).
TEST(EngineObservability, TimerLinesAndRunningAverageThroughput) {
  auto model = std::make_shared<TinyNetImpl>();
  json cfg = {{"train_micro_batch_size_per_gpu", 2},
              {"gradient_accumulation_steps", 2},
              {"steps_per_print", 2},
              {"wall_clock_breakdown", true},
              {"memory_breakdown", true},
              {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.01}}}}}};
  auto [engine, optimizer, sched] = initialize(model, cfg);
  ::testing::internal::CaptureStdout();
  for (int s = 0; s < 4; ++s) {
    for (int m = 0; m < 2; ++m) {
      auto [x, y] = tiny_batch((s * 2 + m) * 2, 2);
      engine->backward(engine->forward(x, y));
      engine->step();
    }
    // DeepSpeed's ThroughputTimer: the first 2 optimizer steps are not timed.
    EXPECT_EQ(engine->running_avg_samples_per_sec().has_value(), s >= 2) << "step " << s + 1;
  }
  const std::string log = ::testing::internal::GetCapturedStdout();
  EXPECT_GT(*engine->running_avg_samples_per_sec(), 0.0);
  const std::string num = R"(\d+\.\d{2})", gb = R"( GB)";
  const std::regex micro("time \\(ms\\) \\| fwd_microstep: " + num + " \\| bwd_microstep: " + num +
                         " \\| bwd_inner_microstep: " + num + " \\| bwd_allreduce_microstep: " +
                         num + " \\| step_microstep: " + num + " \\| mem_allocated: \\d+\\.\\d{4}" +
                         gb + " \\| max_mem_allocated: \\d+\\.\\d{4}" + gb +
                         " \\| cache_allocated: \\d+\\.\\d{4}" + gb +
                         " \\| max_cache_allocated: \\d+\\.\\d{4}" + gb + "\n");
  const std::regex global("time \\(ms\\) \\| fwd: " + num + " \\| bwd: " + num +
                          " \\| bwd_inner: " + num + " \\| bwd_allreduce: " + num +
                          " \\| step: " + num + "\n");
  auto count = [&](const std::regex& re) {
    return std::distance(std::sregex_iterator(log.begin(), log.end(), re), std::sregex_iterator());
  };
  EXPECT_EQ(count(micro), 8) << log;   // every step() call
  EXPECT_EQ(count(global), 4) << log;  // every optimizer step
  EXPECT_EQ(log.find("global_step=2,"), std::string::npos) << log;
  const std::regex tput(R"(epoch=0/micro_step=8/global_step=4, RunningAvgSamplesPerSec=[0-9.e+]+, )"
                        R"(CurrSamplesPerSec=[0-9.e+]+, MemAllocated=[0-9.]+GB, )"
                        R"(MaxMemAllocated=[0-9.]+GB\n)");
  EXPECT_EQ(count(tput), 1) << log;
  EXPECT_NE(log.find("step=4, skipped=0, lr=[0.01], mom=[0.9]"), std::string::npos) << log;
  EXPECT_NE(log.find("(running avg "), std::string::npos) << log;
}

// A client that runs the model itself (not engine->forward) never starts the forward timers or
// the throughput timer: DeepSpeed leaves timers never started out of the line.
TEST(EngineObservability, TimersNeverStartedAreLeftOutOfTheLine) {
  auto model = std::make_shared<TinyNetImpl>();
  json cfg = {{"train_micro_batch_size_per_gpu", 2},
              {"steps_per_print", 1},
              {"wall_clock_breakdown", true},
              {"optimizer", {{"type", "AdamW"}}}};
  auto [engine, optimizer, sched] = initialize(model, cfg);
  ::testing::internal::CaptureStdout();
  for (int s = 0; s < 4; ++s) {
    auto [x, y] = tiny_batch(s * 2, 2);
    engine->backward(model->forward(x, y));
    engine->step();
  }
  const std::string log = ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(log.find("fwd"), std::string::npos) << log;
  EXPECT_NE(log.find("time (ms) | bwd_microstep: "), std::string::npos) << log;
  EXPECT_NE(log.find("time (ms) | bwd: "), std::string::npos) << log;
  EXPECT_EQ(log.find("RunningAvgSamplesPerSec"), std::string::npos) << log;
  EXPECT_FALSE(engine->running_avg_samples_per_sec());
}

// A client printing its own progress turns the engine's per-interval lines off; the memory
// report after the first optimizer step shows the optimizer states the report at
// initialization cannot (they are created at the first update).
TEST(EngineObservability, StepLoggingOffAndSteadyStateMemoryReport) {
  auto model = std::make_shared<TinyNetImpl>();
  json cfg = {{"train_micro_batch_size_per_gpu", 2},
              {"steps_per_print", 1},
              {"zero_optimization", {{"stage", 1}}},
              {"optimizer", {{"type", "AdamW"}}}};
  ::testing::internal::CaptureStdout();
  auto [engine, optimizer, sched] = initialize(model, cfg);
  engine->set_step_logging(false);
  for (int s = 0; s < 4; ++s) {
    auto [x, y] = tiny_batch(s * 2, 2);
    engine->backward(engine->forward(x, y));
    engine->step();
  }
  const std::string log = ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(log.find("RunningAvgSamplesPerSec"), std::string::npos) << log;
  EXPECT_EQ(log.find("skipped=0, lr="), std::string::npos) << log;
  EXPECT_EQ(log.find("samples/s"), std::string::npos) << log;
  EXPECT_NE(log.find("optimizer states 0.00 MB (created at the first optimizer step)"),
            std::string::npos) << log;
  const auto at = log.find("memory after the first optimizer step (steady state)");
  ASSERT_NE(at, std::string::npos) << log;
  EXPECT_EQ(log.find("memory after the first optimizer step", at + 1), std::string::npos) << log;
  const auto m = engine->memory_stats();
  EXPECT_EQ(m.optimizer_state_bytes, 2 * m.param_bytes);  // AdamW: two fp32 moments (fp32, 1 rank)
  EXPECT_GT(m.optimizer_state_bytes, 0);
}

}  // namespace
}  // namespace deepspeed
