// CheckpointWriter: see Note [Decoupled checkpoints] and Note [O_DIRECT checkpoint writes].
#include "runtime/checkpoint/checkpoint_writer.h"

#include <chrono>
#include <cstdio>
#include <utility>

#include "runtime/checkpoint/value_snapshot.h"
#include "util/check.h"
#include "util/logging.h"

namespace deepspeed::checkpoint {
namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

WriteMode mode_of(const std::string& type) {
  if (type == "FAST") return WriteMode::kDirect;
  if (type == "MOCK") return WriteMode::kMock;
  return WriteMode::kBuffered;
}

// DeepSpeed prints its writers' statistics as a dict; this is the same facts as one line.
std::string statistics_line(const std::string& type, const std::string& path,
                            const WriteStats& s) {
  char line[256];
  const double gb = static_cast<double>(s.bytes) / (1 << 30);
  std::snprintf(line, sizeof(line), ": %lld bytes in %.3f s (%.2f GB/s)",
                static_cast<long long>(s.bytes), s.seconds, s.seconds > 0 ? gb / s.seconds : 0.0);
  std::string text = "checkpoint.writer " + type + ": " + path + line;
  if (type == "FAST") {
    text += s.direct_io ? ", O_DIRECT" : ", page cache (no O_DIRECT here)";
    text += ", " + std::to_string(s.buffers) + " buffer drains";
  }
  if (type == "MOCK") text += ", none written";
  return text;
}

}  // namespace

CheckpointWriter::CheckpointWriter(std::optional<CheckpointWriterConfig> config)
    : config_(std::move(config)) {
  if (!config_) return;
  options_.mode = mode_of(config_->type);
  options_.io_buffer_size = config_->io_buffer_size;
  options_.io_buffer_double = config_->io_buffer_double;
  if (config_->decoupled) thread_ = std::thread([this] { run(); });
}

CheckpointWriter::~CheckpointWriter() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
  if (error_) {
    try {
      std::rethrow_exception(error_);
    } catch (const std::exception& e) {
      log::warn(std::string("decoupled checkpoint write failed: ") + e.what());
    }
  }
}

void CheckpointWriter::write_now(const c10::IValue& value, const std::string& path) {
  WriteStats stats;
  WriteOptions options = options_;
  options.stats = &stats;
  checkpoint::save(value, path, options);
  if (config_ && config_->show_statistics) {
    log::info(statistics_line(config_->type, path, stats));
  }
  std::lock_guard<std::mutex> lock(mutex_);
  summary_.files += 1;
  summary_.bytes += stats.bytes;
  summary_.write_seconds += stats.seconds;
}

void CheckpointWriter::save(const c10::IValue& value, const std::string& path) {
  if (!decoupled()) {
    write_now(value, path);
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  Job job{snapshot_for_save(value, path), path};
  {
    std::lock_guard<std::mutex> lock(mutex_);
    summary_.snapshot_seconds += seconds_since(start);
    queue_.push_back(std::move(job));
  }
  changed_.notify_all();
}

FileSaver CheckpointWriter::saver() {
  return [this](const c10::IValue& value, const std::string& path) { save(value, path); };
}

FileSaver CheckpointWriter::immediate_saver() {
  return [this](const c10::IValue& value, const std::string& path) { write_now(value, path); };
}

void CheckpointWriter::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    changed_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, with nothing left to write
    Job job = std::move(queue_.front());
    queue_.pop_front();
    if (error_) continue;  // the checkpoint already failed: it will not be committed
    busy_ = true;
    lock.unlock();
    std::exception_ptr failure;
    try {
      write_now(job.value, job.path);
    } catch (...) {
      failure = std::current_exception();
    }
    job.value = c10::IValue();  // free the snapshot before waiting for more
    lock.lock();
    busy_ = false;
    if (failure && !error_) error_ = failure;
    changed_.notify_all();
  }
}

CheckpointWriter::Summary CheckpointWriter::wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] { return queue_.empty() && !busy_; });
  Summary done = summary_;
  summary_ = Summary{};
  std::exception_ptr failure = std::exchange(error_, nullptr);
  lock.unlock();
  if (failure) std::rethrow_exception(failure);
  return done;
}

}  // namespace deepspeed::checkpoint
