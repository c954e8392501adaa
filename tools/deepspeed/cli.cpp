// CLI11 setup for the launcher: see cli.h. prefix_command() makes CLI11 stop at the first
// positional (PROGRAM) and hand it and everything after it back untouched via remaining().
#include "cli.h"

#include <sys/stat.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <memory>

#include "log.h"
#include "multinode_commands.h"
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

// runner.py flags for the elastic agent, which is not ported. Recognised by name so none of them
// is silently dropped.
constexpr RejectedFlag kRejectedFlags[] = {
    {"--min_elastic_nodes", "--min_elastic_nodes", true},
    {"--max_elastic_nodes", "--max_elastic_nodes", true},
    {"--elastic_training", "--elastic_training", false},
};

constexpr const char* kRejectionReason =
    "elastic training is not supported by deepspeed-cpp; launch a fixed set of hosts "
    "with --hostfile (see docs/launcher.md)";

// Flags before PROGRAM that take the next argument as their value (so PROGRAM can be found before
// CLI11 runs). Values of the first group may start with '-' (ssh/mpirun options, base64), which
// CLI11 would take for an option: they are joined to their flag as --flag=value.
constexpr const char* kDashValueFlags[] = {"--launcher_args", "--world_info", "--include", "-i", "--exclude", "-e"};
constexpr const char* kValueFlags[] = {"--num_gpus", "--num_accelerators", "--master_port", "--master_addr",
                                       "--enable_each_rank_log", "--bind_core_list", "--log_level", "-H",
                                       "--hostfile", "--num_nodes", "--launcher", "--ssh_port", "--node_rank",
                                       "--venv_script", "--min_elastic_nodes", "--max_elastic_nodes", "--autotuning"};

template <typename Names>
bool is_one_of(const std::string& arg, const Names& names) {
  return std::any_of(std::begin(names), std::end(names), [&](const char* n) { return arg == n; });
}

std::vector<std::string> join_dash_values(const std::vector<std::string>& args) {
  std::vector<std::string> out;
  std::size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--" || arg.empty() || arg[0] != '-') break;  // PROGRAM (or --) starts here
    if (is_one_of(arg, kDashValueFlags) && i + 1 < args.size()) {
      std::string name = arg == "-i" ? "--include" : arg == "-e" ? "--exclude" : arg;
      out.push_back(name + "=" + args[++i]);
    } else if (is_one_of(arg, kValueFlags) && i + 1 < args.size()) {
      out.push_back(arg);
      out.push_back(args[++i]);
    } else {
      out.push_back(arg);
    }
  }
  out.insert(out.end(), args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
  return out;
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

}  // namespace

CommandLine parse_command_line(const std::vector<std::string>& raw_args) {
  CommandLine result;
  LauncherOptions& o = result.options;
  const std::vector<std::string> args = join_dash_values(raw_args);

  CLI::App app{
      "deepspeed-cpp launcher: starts the ranks of PROGRAM on this machine, or across the hosts of a "
      "hostfile, with the environment DeepSpeed's launcher sets (RANK, LOCAL_RANK, WORLD_SIZE, "
      "MASTER_ADDR, MASTER_PORT, ...) and --local_rank=<LOCAL_RANK> appended to ARGS. PROGRAM is any "
      "executable, e.g. ./train_gpt or python3 train.py; options stop at PROGRAM.",
      "deepspeed"};
  app.formatter(std::make_shared<LauncherFormatter>());
  app.prefix_command();
  // argparse semantics: a repeated option keeps its last value.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.footer(
      "Every line a rank writes is relayed as '[rank R] line' (stdout to stdout, stderr to stderr; "
      "'HOST: [rank R] line' across hosts). If a rank or host fails the others are stopped on every "
      "host and the launcher exits with its status.\n"
      "Env: DS_LAUNCHER_KILL_GRACE_S = seconds between SIGTERM and SIGKILL when stopping ranks "
      "(default 30). Multi-node runs export NCCL*, GLOO_*, OMP_*, PYTHON*, UCX*, MV2*, MLFLOW*, "
      "DEEPSPEED_*, DS_*, OPENBLAS_*, MKL_*, ONEDNN_*, DNNL_* and the NAME=VALUE lines of .deepspeed_env to every host.");

  app.add_option("--num_gpus,--num_accelerators", o.num_gpus,
                 "Ranks per host (one per GPU; processes on a CPU-only machine). Default: the "
                 "hostfile's slots; without one the CUDA_VISIBLE_DEVICES entries, else every GPU, else 1");
  app.add_option("--master_port", o.master_port, "Port of rank 0's rendezvous (MASTER_PORT)")
      ->capture_default_str();
  app.add_option("--master_addr", o.master_addr,
                 "Address of rank 0 (MASTER_ADDR). Default: 127.0.0.1 on one machine; across hosts "
                 "the first address `hostname -I` prints on the first host (over ssh)");
  app.add_flag("--no_local_rank", o.no_local_rank, "Do not append --local_rank=<LOCAL_RANK> to ARGS");
  app.add_flag("--no_python", o.no_python,
               "Accepted for compatibility; PROGRAM is always run as an executable");
  bool module = false;
  app.add_flag("--module", module, "Rejected: run `deepspeed ... python3 -m MODULE` instead");
  app.add_option("--enable_each_rank_log", o.enable_each_rank_log,
                 "Also write each rank's output to DIR/<timestamp>_rank<R>.log (on its host)");
  app.add_flag("--save_pid", o.save_pid, "Write the launcher's pid to /tmp/<pid>.deepspeed while it runs");
  app.add_flag("--bind_cores_to_rank", o.bind_cores_to_rank,
               "Split the cores evenly over the ranks, pin each rank and set OMP_NUM_THREADS");
  app.add_option("--bind_core_list", o.bind_core_list,
                 "Cores to split with --bind_cores_to_rank, e.g. 0,2-5 (default: all available)");
  app.add_option("--log_level", o.log_level, "Launcher messages: debug, info, warning, error, critical")
      ->capture_default_str();
  app.add_flag("-q,--quiet", o.quiet, "Only warnings and errors from the launcher");

  CLI::App* multi = app.add_option_group("Multi-node");
  CLI::Option* hostfile = multi->add_option("-H,--hostfile", o.hostfile,
                                            "Hostfile of '<host> slots=<N>' lines; used when it exists")
                              ->capture_default_str();
  multi->add_option("-i,--include", o.include, "Hosts/slots to use: host1:0,1@host2 (hostfile order kept)");
  multi->add_option("-e,--exclude", o.exclude, "Hosts/slots to leave out: host1:1@host2");
  multi->add_option("--num_nodes", o.num_nodes, "Use the first N hosts of the hostfile");
  multi->add_option("--launcher", o.launcher, "pdsh (ssh to each host), openmpi (mpirun) or slurm (srun)")
      ->capture_default_str();
  multi->add_option("--launcher_args", o.launcher_args,
                    "Extra words for ssh (pdsh), mpirun (openmpi) or srun (slurm), as one quoted string");
  multi->add_option("--ssh_port", o.ssh_port, "Port for ssh to the hosts (default: ssh's)");
  multi->add_flag("--force_multi", o.force_multi, "Multi-node launch (ssh/mpirun/srun) even for one host");
  multi->add_flag("--no_ssh", o.no_ssh, "Start only this host's ranks (--node_rank); run it on every host");
  multi->add_flag("--no_ssh_check", o.no_ssh_check, "Skip the passwordless-ssh check of the first host");
  multi->add_option("--node_rank", o.node_rank, "This host's index in the hostfile, with --no_ssh");
  multi->add_option("--venv_script", o.venv_script, "Script each host sources before starting its ranks");

  CLI::App* per_node = app.add_option_group("Per-node mode (what the launcher starts on each host)");
  per_node->add_option("--world_info", o.world_info, "The job's hosts and slots (base64 JSON)");
  per_node->add_flag("--stop_on_stdin_eof", o.stop_on_stdin_eof,
                     "Stop the ranks when stdin closes or says SIGINT/SIGTERM (the controlling launcher)");

  app.add_option("--autotuning", o.autotuning,
                 "tune: find the fastest ZeRO stage, micro-batch and ZeRO knobs for PROGRAM with short "
                 "experiments (the config's autotuning section); run: then train with the best "
                 "(docs/autotuning.md)")
      ->check(CLI::IsMember({"tune", "run"}));

  CLI::App* rejected_group = app.add_option_group("Elastic training (recognised, rejected)");
  std::vector<std::pair<const RejectedFlag*, CLI::Option*>> rejected;
  std::vector<std::string> ignored_values(std::size(kRejectedFlags));
  // A std::string, not a literal: under C++20 (the CUDA build) a char array is constructible
  // from a long (parenthesized aggregate init), which makes CLI11's add_flag overloads ambiguous.
  const std::string not_supported = "not supported";
  for (std::size_t i = 0; i < std::size(kRejectedFlags); ++i) {
    const RejectedFlag& flag = kRejectedFlags[i];
    CLI::Option* opt = flag.takes_value
                           ? rejected_group->add_option(flag.names, ignored_values[i], not_supported)
                           : rejected_group->add_flag(flag.names, not_supported);
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
    throw UsageError(std::string(e.what()) + "; run `deepspeed --help` for the supported flags");
  }

  for (const auto& [flag, opt] : rejected) {
    if (opt->count() > 0) throw UsageError(std::string(flag->display) + ": " + kRejectionReason);
  }
  if (module) {
    throw UsageError(
        "--module is not supported: deepspeed-cpp runs PROGRAM as an executable, not as a Python "
        "module; use `deepspeed [OPTIONS] python3 -m MODULE ARGS...` instead");
  }
  std::transform(o.launcher.begin(), o.launcher.end(), o.launcher.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  // Now, so a typo fails before anything starts (DeepSpeed only notices it across hosts).
  validate_launcher_name(o.launcher);
  if (o.ssh_port == 0 || o.ssh_port < -1 || o.ssh_port > 65535) {
    throw UsageError("--ssh_port " + std::to_string(o.ssh_port) + ": expected a TCP port in 1..65535");
  }
  o.hostfile_given = hostfile->count() > 0;
  if (o.hostfile_given && !file_exists(o.hostfile)) {
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
