// CLI11 setup for the launcher: see cli.h. prefix_command() makes CLI11 stop at the first
// positional (PROGRAM) and hand it and everything after it back untouched via remaining().
#include "cli.h"

#include <sys/stat.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <memory>

#include "log.h"
#include "usage_error.h"

namespace deepspeed::launcher {
namespace {

constexpr const char* kUsageLine = "deepspeed [OPTIONS] PROGRAM [ARGS...]";

// A DeepSpeed runner flag this launcher recognises but refuses; `names` as CLI11 spells them.
struct RejectedFlag {
  const char* names;
  const char* display;  // how the error names it
  bool takes_value;
};

// runner.py flags that only make sense across machines (or for the elastic agent and the
// autotuner, which are not ported). Recognised by name so none of them is silently dropped.
constexpr RejectedFlag kRejectedFlags[] = {
    {"-i,--include", "-i/--include", true},
    {"-e,--exclude", "-e/--exclude", true},
    {"--min_elastic_nodes", "--min_elastic_nodes", true},
    {"--max_elastic_nodes", "--max_elastic_nodes", true},
    {"--launcher", "--launcher", true},
    {"--launcher_args", "--launcher_args", true},
    {"--node_rank", "--node_rank", true},
    {"--ssh_port", "--ssh_port", true},
    {"--venv_script", "--venv_script", true},
    {"--autotuning", "--autotuning", true},
    {"--no_ssh", "--no_ssh", false},
    {"--no_ssh_check", "--no_ssh_check", false},
    {"--force_multi", "--force_multi", false},
    {"--elastic_training", "--elastic_training", false},
};

constexpr const char* kRejectionReason =
    "multi-node launching is not supported yet (nor elastic training or autotuning); this launcher "
    "starts ranks on the local machine only: use --num_gpus N (see docs/launcher.md)";

std::string rejection_message(const std::string& flag_and_value) {
  return flag_and_value + ": " + kRejectionReason;
}

bool file_exists(const std::string& path) {
  struct stat st{};
  return ::stat(path.c_str(), &st) == 0;
}

// Names the usage as "... PROGRAM [ARGS...]": CLI11 does not show the prefix-command remainder.
class LauncherFormatter : public CLI::Formatter {
 public:
  std::string make_usage(const CLI::App*, std::string) const override {
    return std::string("Usage: ") + kUsageLine + "\n";
  }
};

// When CLI11 fails on a value (e.g. `--launcher_args "-x y"` looks like an option to it), report
// the rejected multi-node flag instead if one appears among the options before PROGRAM.
void rethrow_if_rejected_flag_present(const std::vector<std::string>& args) {
  for (const std::string& arg : args) {
    if (arg.empty() || arg[0] != '-' || arg == "--") break;
    std::string name = arg.substr(0, arg.find('='));
    for (const RejectedFlag& flag : kRejectedFlags) {
      std::string names = flag.names;
      std::size_t start = 0;
      while (start < names.size()) {
        std::size_t comma = names.find(',', start);
        if (names.substr(start, comma - start) == name) throw UsageError(rejection_message(flag.display));
        if (comma == std::string::npos) break;
        start = comma + 1;
      }
    }
  }
}

}  // namespace

CommandLine parse_command_line(const std::vector<std::string>& args) {
  CommandLine result;
  LauncherOptions& o = result.options;

  CLI::App app{
      "deepspeed-cpp launcher: starts N ranks of PROGRAM on this machine with the environment "
      "DeepSpeed's launcher sets (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...) "
      "and --local_rank=<LOCAL_RANK> appended to ARGS. PROGRAM is any executable, e.g. "
      "./train_gpt or python3 train.py; options stop at PROGRAM.",
      "deepspeed"};
  app.formatter(std::make_shared<LauncherFormatter>());
  app.prefix_command();
  app.footer(
      "Every line a rank writes is relayed as '[rank R] line' (stdout to stdout, stderr to "
      "stderr). If a rank fails the others are stopped and the launcher exits with its status.\n"
      "Env: DS_LAUNCHER_KILL_GRACE_S = seconds between SIGTERM and SIGKILL when stopping ranks "
      "(default 30).");

  app.add_option("--num_gpus,--num_accelerators", o.num_gpus,
                 "Ranks to start (one per GPU; processes on a CPU-only machine). Default: the "
                 "CUDA_VISIBLE_DEVICES entries, else every GPU, else 1");
  app.add_option("--master_port", o.master_port, "Port of rank 0's rendezvous (MASTER_PORT)")
      ->capture_default_str();
  app.add_option("--master_addr", o.master_addr, "Address of rank 0 (MASTER_ADDR)")->capture_default_str();
  app.add_flag("--no_local_rank", o.no_local_rank, "Do not append --local_rank=<LOCAL_RANK> to ARGS");
  app.add_flag("--no_python", o.no_python,
               "Accepted for compatibility; PROGRAM is always run as an executable");
  bool module = false;
  app.add_flag("--module", module, "Rejected: run `deepspeed ... python3 -m MODULE` instead");
  app.add_option("--enable_each_rank_log", o.enable_each_rank_log,
                 "Also write each rank's output to DIR/<timestamp>_rank<R>.log");
  app.add_flag("--save_pid", o.save_pid, "Write the launcher's pid to /tmp/<pid>.deepspeed while it runs");
  app.add_flag("--bind_cores_to_rank", o.bind_cores_to_rank,
               "Split the cores evenly over the ranks, pin each rank and set OMP_NUM_THREADS");
  app.add_option("--bind_core_list", o.bind_core_list,
                 "Cores to split with --bind_cores_to_rank, e.g. 0,2-5 (default: all available)");
  app.add_option("--log_level", o.log_level, "Launcher messages: debug, info, warning, error, critical")
      ->capture_default_str();
  app.add_flag("-q,--quiet", o.quiet, "Only warnings and errors from the launcher");

  std::string hostfile;
  app.add_option("-H,--hostfile", hostfile,
                 "Multi-node: rejected if the file exists; a missing file warns and runs locally");
  int num_nodes = -1;
  app.add_option("--num_nodes", num_nodes, "Multi-node: only 1 is accepted");

  CLI::App* multi = app.add_option_group("Multi-node, elastic, autotuning (recognised, rejected)");
  std::vector<std::pair<const RejectedFlag*, CLI::Option*>> rejected;
  std::vector<std::string> ignored_values(std::size(kRejectedFlags));
  for (std::size_t i = 0; i < std::size(kRejectedFlags); ++i) {
    const RejectedFlag& flag = kRejectedFlags[i];
    CLI::Option* opt = flag.takes_value
                           ? multi->add_option(flag.names, ignored_values[i], "not supported yet")
                           : multi->add_flag(flag.names, "not supported yet");
    rejected.emplace_back(&flag, opt);
  }

  try {
    std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 wants argv reversed
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    result.help_requested = true;
    result.help_text = app.help();
    return result;
  } catch (const CLI::ParseError& e) {
    rethrow_if_rejected_flag_present(args);
    throw UsageError(std::string(e.what()) + "; run `deepspeed --help` for the supported flags");
  }

  for (const auto& [flag, opt] : rejected) {
    if (opt->count() > 0) throw UsageError(rejection_message(flag->display));
  }
  if (num_nodes != -1 && num_nodes != 1) {
    throw UsageError(rejection_message("--num_nodes " + std::to_string(num_nodes)));
  }
  if (module) {
    throw UsageError(
        "--module is not supported: deepspeed-cpp runs PROGRAM as an executable, not as a Python "
        "module; use `deepspeed [OPTIONS] python3 -m MODULE ARGS...` instead");
  }
  if (!hostfile.empty()) {
    if (file_exists(hostfile)) {
      throw UsageError(rejection_message("-H/--hostfile " + hostfile));
    }
    // Matches DeepSpeed's runner: a missing hostfile means "this machine only".
    result.warnings.push_back("Unable to find hostfile, will proceed with training with local "
                              "resources only.");
  }
  parse_log_level(o.log_level);  // validate now, before anything starts

  std::vector<std::string> rest = app.remaining();
  if (!rest.empty() && rest.front() == "--") rest.erase(rest.begin());
  if (rest.empty()) {
    throw UsageError(std::string("missing PROGRAM; usage: ") + kUsageLine +
                     " (run `deepspeed --help` for the flags)");
  }
  if (rest.front().size() > 1 && rest.front()[0] == '-') {
    throw UsageError("unknown option '" + rest.front() +
                     "' before PROGRAM; run `deepspeed --help` for the supported flags");
  }
  o.program = rest.front();
  o.program_args.assign(rest.begin() + 1, rest.end());
  return result;
}

}  // namespace deepspeed::launcher
