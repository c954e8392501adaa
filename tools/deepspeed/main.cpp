// `deepspeed` entry point: command line -> LaunchPlan -> run_local(). The only place that exits;
// everything below throws (UsageError -> 2, anything else -> 1) or returns the ranks' status.
#include <iostream>
#include <string>
#include <vector>

#include "cli.h"
#include "host_info.h"
#include "launch_plan.h"
#include "local_runner.h"
#include "log.h"
#include "pid_file.h"
#include "program_path.h"
#include "usage_error.h"

int main(int argc, char** argv) {
  namespace dl = deepspeed::launcher;
  try {
    dl::CommandLine command_line = dl::parse_command_line(std::vector<std::string>(argv + 1, argv + argc));
    if (command_line.help_requested) {
      std::cout << command_line.help_text;
      return 0;
    }
    const dl::LauncherOptions& options = command_line.options;
    dl::LogLevel level = dl::parse_log_level(options.log_level);
    if (options.quiet && level < dl::LogLevel::kWarning) level = dl::LogLevel::kWarning;
    dl::set_log_level(level);
    for (const std::string& warning : command_line.warnings) dl::log_warning(warning);

    dl::HostInfo host = dl::detect_host_info();
    dl::LaunchPlan plan = dl::make_launch_plan(options, host);
    plan.program_path = dl::resolve_program(options.program, host.path_env);
    for (const std::string& warning : plan.warnings) dl::log_warning(warning);

    dl::RunnerOptions runner_options;
    runner_options.kill_grace_s = dl::kill_grace_seconds_from_env();
    runner_options.each_rank_log_dir = options.enable_each_rank_log;

    dl::PidFile pid_file(options.save_pid);
    dl::log_info(plan.summary());
    return dl::run_local(plan, runner_options);
  } catch (const dl::UsageError& e) {
    dl::log_error(std::string("error: ") + e.what());
    return dl::kUsageExitCode;
  } catch (const std::exception& e) {
    dl::log_error(std::string("error: ") + e.what());
    return 1;
  }
}
