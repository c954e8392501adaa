// TensorBoardMonitor: appends framed Event records to one event file and flushes per batch of
// events (DeepSpeed calls summary_writer.flush() after each write_events).
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "deepspeed/monitor.h"
#include "monitor/event_file_format.h"
#include "monitor/log_dir.h"
#include "util/check.h"

namespace deepspeed::monitor {
namespace {

double unix_time_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string hostname() {
  char buf[256] = {0};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "localhost";
  return buf;
}

// Torch's EventFileWriter appends a process-wide counter so that two writers opened in the same
// second by the same process get distinct files.
std::atomic<int> next_file_uid{0};

void write_all(std::FILE* f, const std::string& bytes, const std::string& path) {
  DS_CHECK(std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size() && std::fflush(f) == 0,
           Error, "tensorboard: cannot write event file ", path, ": ", std::strerror(errno));
}

}  // namespace

TensorBoardMonitor::TensorBoardMonitor(const MonitorConfig& config) {
  log_dir_ = detail::make_log_dir(config, "tensorboard");
  const double now = unix_time_s();
  char name[512];
  std::snprintf(name, sizeof name, "events.out.tfevents.%010lld.%s.%d.%d",
                static_cast<long long>(now), hostname().c_str(), static_cast<int>(::getpid()),
                next_file_uid.fetch_add(1));
  file_path_ = log_dir_ + "/" + name;
  file_ = std::fopen(file_path_.c_str(), "wb");
  DS_CHECK(file_ != nullptr, ConfigError, "tensorboard.output_path: cannot create event file ",
           file_path_, ": ", std::strerror(errno));
  write_all(file_, detail::frame_record(detail::encode_file_version_event(now)), file_path_);
}

TensorBoardMonitor::~TensorBoardMonitor() {
  if (file_) std::fclose(file_);
}

void TensorBoardMonitor::write_events(const std::vector<Event>& events) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::string bytes;
  const double now = unix_time_s();
  for (const auto& e : events) {
    bytes += detail::frame_record(
        detail::encode_scalar_event(now, e.step, e.name, static_cast<float>(e.value)));
  }
  write_all(file_, bytes, file_path_);
}

}  // namespace deepspeed::monitor
