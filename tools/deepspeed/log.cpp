// Launcher messages: see log.h. Written with one write() per line (fd_io) because rank output is
// relayed to the same stderr by raw writes; iostream buffering would interleave with it.
#include "log.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>

#include "fd_io.h"
#include "usage_error.h"

namespace deepspeed::launcher {
namespace {

LogLevel g_level = LogLevel::kInfo;

void emit(LogLevel level, std::string_view tag, const std::string& message) {
  if (level < g_level && level < LogLevel::kError) return;
  std::string line = "deepspeed: ";
  line += tag;
  line += message;
  line += '\n';
  write_all(STDERR_FILENO, line);
}

}  // namespace

LogLevel parse_log_level(std::string_view name) {
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (lower == "debug") return LogLevel::kDebug;
  if (lower == "info") return LogLevel::kInfo;
  if (lower == "warning") return LogLevel::kWarning;
  if (lower == "error") return LogLevel::kError;
  if (lower == "critical") return LogLevel::kCritical;
  throw UsageError("--log_level '" + std::string(name) +
                   "': expected one of debug, info, warning, error, critical");
}

void set_log_level(LogLevel level) { g_level = level; }

void log_debug(const std::string& message) { emit(LogLevel::kDebug, "", message); }
void log_info(const std::string& message) { emit(LogLevel::kInfo, "", message); }
void log_warning(const std::string& message) { emit(LogLevel::kWarning, "warning: ", message); }
void log_error(const std::string& message) { emit(LogLevel::kError, "", message); }

}  // namespace deepspeed::launcher
