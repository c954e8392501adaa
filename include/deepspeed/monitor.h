// Monitors: DeepSpeed's deepspeed/monitor/ in C++. Scalars (name, value, step) go to TensorBoard
// event files (`tensorboard`) and/or CSV files (`csv_monitor`), written by global rank 0 only.
// `wandb` and `comet` need Python clients and are refused by name. The engine writes DeepSpeed's
// series (the k* names below, x axis = global samples); client code may write its own scalars
// through the same MonitorMaster. See docs/observability.md.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "deepspeed/config.h"

namespace deepspeed::monitor {

/// DeepSpeed's series names (engine.py); every one is plotted against global_samples.
inline constexpr const char* kTrainLoss = "Train/Samples/train_loss";
inline constexpr const char* kEvalLoss = "Train/Samples/eval_loss";
inline constexpr const char* kLr = "Train/Samples/lr";
inline constexpr const char* kLossScale = "Train/Samples/loss_scale";
inline constexpr const char* kElapsedForward = "Train/Samples/elapsed_time_ms_forward";
inline constexpr const char* kElapsedBackward = "Train/Samples/elapsed_time_ms_backward";
inline constexpr const char* kElapsedBackwardInner = "Train/Samples/elapsed_time_ms_backward_inner";
inline constexpr const char* kElapsedBackwardAllreduce =
    "Train/Samples/elapsed_time_ms_backward_allreduce";
inline constexpr const char* kElapsedStep = "Train/Samples/elapsed_time_ms_step";

/// One scalar: DeepSpeed's (name, value, step) tuple.
struct Event {
  std::string name;
  double value = 0.0;
  int64_t step = 0;
};

class Monitor {
 public:
  virtual ~Monitor() = default;
  /// Records `events` in order and flushes them to disk before returning.
  virtual void write_events(const std::vector<Event>& events) = 0;
};

/// `tensorboard`: one event file per monitor, created in <output_path>/<job_name>/ (relative to
/// the working directory when output_path is "", as DeepSpeed's os.path.join does) and named
/// events.out.tfevents.<unix time, 10 digits>.<hostname>.<pid>.<n> like torch's SummaryWriter.
/// Values are stored as float32 `simple_value`s (add_scalar's encoding). Thread-safe.
class TensorBoardMonitor final : public Monitor {
 public:
  /// Creates the directory and the file (with its "brain.Event:2" header record).
  /// Throws ConfigError naming tensorboard.output_path when either cannot be created.
  explicit TensorBoardMonitor(const MonitorConfig& config);
  ~TensorBoardMonitor() override;
  TensorBoardMonitor(const TensorBoardMonitor&) = delete;
  TensorBoardMonitor& operator=(const TensorBoardMonitor&) = delete;

  void write_events(const std::vector<Event>& events) override;
  const std::string& log_dir() const { return log_dir_; }
  const std::string& file_path() const { return file_path_; }

 private:
  std::mutex mutex_;
  std::string log_dir_;
  std::string file_path_;
  std::FILE* file_ = nullptr;
};

/// `csv_monitor`: one file per series in <output_path>/<job_name>/, named after the series with
/// '/' and ' ' replaced by '_' (Train/Samples/lr -> Train_Samples_lr.csv). Files are appended
/// to; the header row "step,<last path component of the name>" is written the first time this
/// monitor writes a series (so a resumed job appends a second header, as DeepSpeed's does).
/// Rows are "step,value" with Python's float repr and "\r\n" endings (Python's csv module).
class CsvMonitor final : public Monitor {
 public:
  /// Creates the directory; throws ConfigError naming csv_monitor.output_path if it cannot.
  explicit CsvMonitor(const MonitorConfig& config);
  void write_events(const std::vector<Event>& events) override;
  const std::string& log_dir() const { return log_dir_; }
  /// The file a series goes to.
  std::string file_for(const std::string& name) const;

 private:
  std::mutex mutex_;
  std::string log_dir_;
  std::set<std::string> started_;  // series whose header this monitor has written
};

/// Fans events out to the enabled monitors on global rank 0 (DeepSpeed's MonitorMaster).
class MonitorMaster final : public Monitor {
 public:
  /// `rank`: the caller's global rank; -1 asks deepspeed::comm (0 before init_distributed).
  /// Monitors are created on rank 0 only. Throws NotSupportedError for wandb / comet.
  explicit MonitorMaster(const DeepSpeedConfig& config, int rank = -1);
  /// True when any monitor section is enabled, on every rank (DeepSpeed's monitor.enabled:
  /// the engine tests it before building its events, then writes from rank 0).
  bool enabled() const { return enabled_; }
  /// No-op on ranks other than 0 and when nothing is enabled.
  void write_events(const std::vector<Event>& events) override;

  TensorBoardMonitor* tensorboard() const { return tensorboard_; }
  CsvMonitor* csv_monitor() const { return csv_; }

 private:
  bool enabled_ = false;
  std::vector<std::unique_ptr<Monitor>> monitors_;
  TensorBoardMonitor* tensorboard_ = nullptr;
  CsvMonitor* csv_ = nullptr;
};

}  // namespace deepspeed::monitor
