// CsvMonitor: one append-mode file per series, in DeepSpeed's csv_monitor layout.
#include <cerrno>
#include <cstring>
#include <fstream>

#include "deepspeed/monitor.h"
#include "monitor/log_dir.h"
#include "monitor/python_float.h"
#include "util/check.h"

namespace deepspeed::monitor {
namespace {

std::string sanitized(const std::string& name) {
  std::string out = name;
  for (char& c : out) {
    if (c == '/' || c == ' ') c = '_';
  }
  return out;
}

// DeepSpeed's engine names series "A/B/c"; the column header is the last component.
std::string header_for(const std::string& name) {
  const size_t slash = name.rfind('/');
  return slash == std::string::npos ? name : name.substr(slash + 1);
}

}  // namespace

CsvMonitor::CsvMonitor(const MonitorConfig& config)
    : log_dir_(detail::make_log_dir(config, "csv_monitor")) {}

std::string CsvMonitor::file_for(const std::string& name) const {
  return log_dir_ + "/" + sanitized(name) + ".csv";
}

void CsvMonitor::write_events(const std::vector<Event>& events) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& e : events) {
    const std::string path = file_for(e.name);
    std::ofstream out(path, std::ios::app | std::ios::binary);
    DS_CHECK(out.good(), Error, "csv_monitor: cannot append to ", path, ": ", std::strerror(errno));
    // Python's csv.writer ends rows with "\r\n"; headers are per monitor instance.
    if (started_.insert(sanitized(e.name)).second) out << "step," << header_for(e.name) << "\r\n";
    out << e.step << "," << detail::python_float_repr(e.value) << "\r\n";
    out.flush();
    DS_CHECK(out.good(), Error, "csv_monitor: cannot write ", path, ": ", std::strerror(errno));
  }
}

}  // namespace deepspeed::monitor
