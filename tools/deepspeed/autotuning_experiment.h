// One autotuning experiment: a ds_config.json and the job's command line, run to completion by
// another `deepspeed` launcher process (without --autotuning) with its output in files, under a
// time limit, and its result: the metric the engine wrote, or why there is none (out of memory,
// another error, time limit). An experiment that fails is recorded; it never ends the tuner.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace deepspeed::launcher {

enum class ExperimentStatus { kOk, kOutOfMemory, kFailed, kTimedOut, kPruned };

const char* experiment_status_name(ExperimentStatus status);

struct Experiment {
  std::string name;               // DeepSpeed's naming: z<stage>_..._gas<G>_tmbspg<M>
  std::string space;              // the tuning space it belongs to (z0, z1, ..., z2_knobs)
  nlohmann::json ds_config;       // the full config the job runs with (autotuning section included)
  double predicted_bytes = 0;     // the memory formula's peak per rank (0: not predicted)
};

struct ExperimentResult {
  ExperimentStatus status = ExperimentStatus::kFailed;
  nlohmann::json metrics;         // the engine's metric (or model-info) file, when status is kOk
  double metric_value = 0;        // metrics[metric], 0 unless kOk
  double wall_s = 0;              // the experiment's run time
  int exit_code = -1;
  std::string error;              // the first error line of stderr.log
  std::string dir;                // exps_dir/<name>
  int master_port = 0;            // the port the last run used
};

struct ExperimentLaunch {
  std::string launcher_path;               // this launcher (/proc/self/exe)
  std::vector<std::string> launcher_flags; // the user's launcher flags, --autotuning removed
  int master_port = 29500;                 // + the experiment's index (see experiment_port)
  std::string program;
  std::vector<std::string> program_args;   // with the config flag; arg_mappings applied per run
  std::map<std::string, std::string> arg_mappings;
  std::map<std::string, std::string> env;  // set in the experiment's environment ("" unsets)
  double timeout_s = 600;
};

/// The program's arguments with the config flag's value replaced by `config_path`
/// (--deepspeed_config X, --deepspeed_config=X, or DeepSpeed's --deepspeed X.json) and each
/// arg_mappings flag set to the config's value for its key ("a.b" reaches nested keys).
/// Throws UsageError when the arguments name no config file.
std::vector<std::string> experiment_program_args(const std::vector<std::string>& args,
                                                 const std::string& config_path,
                                                 const nlohmann::json& ds_config,
                                                 const std::map<std::string, std::string>& arg_mappings);

/// The config file the program's arguments name ("" when none).
std::string config_path_in_args(const std::vector<std::string>& args);

/// Runs of one experiment whose port was taken, and the distance between their ports.
constexpr int kExperimentPortAttempts = 4;
constexpr int kExperimentPortRetryStride = 1000;

/// The master port of experiment `index`'s run `attempt` (0 first): master_port + index, moved
/// by kExperimentPortRetryStride per retry, kept within 1024..65535.
int experiment_port(int master_port, int index, int attempt);

/// True when a job's output says a socket could not bind its port (errno EADDRINUSE).
bool is_port_in_use_text(const std::string& text);

/// Writes exps_dir/<name>/{exp.json, ds_config.json, cmd.txt}, runs the job with stdout.log and
/// stderr.log there, and reads `metric_file` (metric value `metric`). The job's master port is
/// experiment_port(launch.master_port, index, 0); when rank 0 cannot bind it because another
/// process holds it, the job runs again on the next attempt's port (kExperimentPortAttempts runs
/// at most), and exp.json records every port tried.
ExperimentResult run_experiment(const Experiment& exp, const ExperimentLaunch& launch,
                                const std::string& exps_dir, int index, const std::string& metric_file,
                                const std::string& metric);

/// The job's argv for `config_path`: this launcher, the user's launcher flags, --master_port
/// `port`, the program and its arguments for this config.
std::vector<std::string> experiment_argv(const ExperimentLaunch& launch, const std::string& config_path,
                                         const nlohmann::json& ds_config, int port);

/// experiment_argv as one shell line (words quoted where needed).
std::string experiment_command(const ExperimentLaunch& launch, const std::string& config_path,
                               const nlohmann::json& ds_config, int port);

/// True when `stderr_text` says a rank ran out of memory (the engine's OutOfMemoryError, the
/// allocator's message, or a rank killed by the kernel's OOM killer).
bool is_out_of_memory_text(const std::string& stderr_text);

}  // namespace deepspeed::launcher
