// Log directory creation shared by TensorBoardMonitor and CsvMonitor.
#include "monitor/log_dir.h"

#include <filesystem>
#include <system_error>

#include "util/check.h"

namespace deepspeed::monitor::detail {

std::string make_log_dir(const MonitorConfig& config, const char* section) {
  namespace fs = std::filesystem;
  const fs::path dir = config.output_path.empty() ? fs::path(config.job_name)
                                                  : fs::path(config.output_path) / config.job_name;
  std::error_code ec;
  fs::create_directories(dir, ec);
  DS_CHECK(!ec && fs::is_directory(dir), ConfigError, section, ".output_path: cannot create the ",
           section, " directory ", dir.string(), ": ", ec ? ec.message() : "not a directory",
           "; set ", section, ".output_path to a writable directory");
  return dir.string();
}

}  // namespace deepspeed::monitor::detail
