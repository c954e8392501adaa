// The directory both monitors write to: <output_path>/<job_name>, as DeepSpeed's
// os.path.join(output_path, job_name) (so "" means relative to the working directory).
#pragma once

#include <string>

#include "deepspeed/config.h"

namespace deepspeed::monitor::detail {

/// Creates the directory (and parents). Throws ConfigError naming `<section>.output_path`.
std::string make_log_dir(const MonitorConfig& config, const char* section);

}  // namespace deepspeed::monitor::detail
