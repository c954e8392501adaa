// `deepspeed` entry point: command line -> launch(). The only place that exits; everything below
// throws (UsageError -> 2, anything else -> 1) or returns the job's status.
#include <iostream>
#include <string>
#include <tuple>
#include <vector>

#include "autotuner.h"
#include "cli.h"
#include "host_info.h"
#include "launch.h"
#include "log.h"
#include "usage_error.h"

int main(int argc, char** argv) {
  namespace dl = deepspeed::launcher;
  try {
    const std::vector<std::string> args(argv + 1, argv + argc);
    dl::CommandLine command_line = dl::parse_command_line(args);
    if (command_line.help_requested) {
      std::cout << command_line.help_text;
      return 0;
    }
    const dl::LauncherOptions& options = command_line.options;
    dl::LogLevel level = dl::parse_log_level(options.log_level);
    if (options.quiet && level < dl::LogLevel::kWarning) level = dl::LogLevel::kWarning;
    dl::set_log_level(level);
    for (const std::string& warning : command_line.warnings) dl::log_warning(warning);
    if (!options.autotuning.empty()) {
      // Each experiment is this launcher run again, without --autotuning (docs/autotuning.md).
      dl::AutotuneRequest request;
      request.mode = options.autotuning;
      request.options = options;
      request.launcher_flags = dl::launcher_flags_without_autotuning(args, 1 + options.program_args.size());
      std::tie(request.ranks, request.ranks_per_host) = dl::autotuning_world(options, dl::detect_host_info());
      request.launcher_path = dl::self_executable_path();
      return dl::run_autotuning(request);
    }
    return dl::launch(options, dl::detect_host_info());
  } catch (const dl::UsageError& e) {
    dl::log_error(std::string("error: ") + e.what());
    return dl::kUsageExitCode;
  } catch (const std::exception& e) {
    dl::log_error(std::string("error: ") + e.what());
    return 1;
  } catch (...) {
    dl::log_error("error: unknown exception (a bug in deepspeed-cpp)");
    return 1;
  }
}
