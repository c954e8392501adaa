// The launcher's own messages on stderr, filtered by --log_level / -q like DeepSpeed's runner.
// Every message is one line starting with "deepspeed: " so it stands apart from "[rank R] " lines.
#pragma once

#include <string>
#include <string_view>

namespace deepspeed::launcher {

enum class LogLevel { kDebug, kInfo, kWarning, kError, kCritical };

// Parses DeepSpeed's --log_level values (debug, info, warning, error, critical; any case).
// Throws UsageError naming the value otherwise.
LogLevel parse_log_level(std::string_view name);

// Process-wide threshold; messages below it are dropped. Default kInfo.
void set_log_level(LogLevel level);

void log_debug(const std::string& message);    // "deepspeed: <message>" at --log_level debug
void log_info(const std::string& message);     // "deepspeed: <message>"
void log_warning(const std::string& message);  // "deepspeed: warning: <message>"
void log_error(const std::string& message);    // "deepspeed: <message>", never filtered

}  // namespace deepspeed::launcher
