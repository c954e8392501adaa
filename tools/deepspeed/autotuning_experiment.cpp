// run_experiment(): see autotuning_experiment.h. The job is this launcher run again (fork + exec),
// so every launcher flag the user gave applies to each experiment as it would to the real job.
#include "autotuning_experiment.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "log.h"
#include "shell_words.h"
#include "usage_error.h"

namespace deepspeed::launcher {
namespace fs = std::filesystem;
namespace {

const nlohmann::json* value_at(const nlohmann::json& config, const std::string& dotted_key) {
  const nlohmann::json* v = &config;
  std::stringstream parts(dotted_key);
  std::string part;
  while (std::getline(parts, part, '.')) {
    if (!v->is_object() || !v->contains(part)) return nullptr;
    v = &(*v)[part];
  }
  return v;
}

std::string scalar_text(const nlohmann::json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (d == static_cast<double>(static_cast<long long>(d))) return std::to_string(static_cast<long long>(d));
  }
  return v.dump();
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  if (!out) throw std::runtime_error("autotuning: cannot write " + path);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string first_error_line(const std::string& text) {
  std::stringstream lines(text);
  std::string line, fallback;
  while (std::getline(lines, line)) {
    if (line.find("rror") != std::string::npos || line.find("out of memory") != std::string::npos) return line;
    if (!line.empty()) fallback = line;
  }
  return fallback;
}

// Runs argv with stdout/stderr into files; SIGTERM after timeout_s (the launcher stops its
// ranks), SIGKILL 15 s later. Returns the exit status (128 + signal) and whether it timed out.
std::pair<int, bool> run_to_files(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
                                  const std::string& out_path, const std::string& err_path, double timeout_s) {
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error(std::string("autotuning: fork failed: ") + std::strerror(errno));
  if (pid == 0) {
    const int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int in = ::open("/dev/null", O_RDONLY);
    if (out < 0 || err < 0 || in < 0) ::_exit(127);
    ::dup2(in, 0);
    ::dup2(out, 1);
    ::dup2(err, 2);
    for (const auto& [k, v] : env) {
      if (v.empty()) {
        ::unsetenv(k.c_str());
      } else {
        ::setenv(k.c_str(), v.c_str(), 1);
      }
    }
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    std::fprintf(stderr, "autotuning: cannot run %s: %s\n", args[0], std::strerror(errno));
    ::_exit(127);
  }
  const auto start = std::chrono::steady_clock::now();
  bool timed_out = false, killed = false;
  int status = 0;
  for (;;) {
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (r < 0 && errno != EINTR) break;
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!timed_out && elapsed > timeout_s) {
      timed_out = true;
      ::kill(pid, SIGTERM);
    } else if (timed_out && !killed && elapsed > timeout_s + 15) {
      killed = true;
      ::kill(pid, SIGKILL);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  return {code, timed_out};
}

}  // namespace

const char* experiment_status_name(ExperimentStatus status) {
  switch (status) {
    case ExperimentStatus::kOk: return "ok";
    case ExperimentStatus::kOutOfMemory: return "out of memory";
    case ExperimentStatus::kFailed: return "failed";
    case ExperimentStatus::kTimedOut: return "timed out";
    case ExperimentStatus::kPruned: return "pruned";
  }
  return "?";
}

std::string config_path_in_args(const std::vector<std::string>& args) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.rfind("--deepspeed_config=", 0) == 0) return a.substr(std::strlen("--deepspeed_config="));
    if (a == "--deepspeed_config" && i + 1 < args.size()) return args[i + 1];
    // Matches DeepSpeed's autotuner: --deepspeed followed by a .json file.
    if (a == "--deepspeed" && i + 1 < args.size() && args[i + 1].find(".json") != std::string::npos) {
      return args[i + 1];
    }
  }
  return "";
}

std::vector<std::string> experiment_program_args(const std::vector<std::string>& args,
                                                 const std::string& config_path,
                                                 const nlohmann::json& ds_config,
                                                 const std::map<std::string, std::string>& arg_mappings) {
  std::vector<std::string> out = args;
  bool replaced = false;
  for (size_t i = 0; i < out.size() && !replaced; ++i) {
    if (out[i].rfind("--deepspeed_config=", 0) == 0) {
      out[i] = "--deepspeed_config=" + config_path;
      replaced = true;
    } else if ((out[i] == "--deepspeed_config" ||
                (out[i] == "--deepspeed" && out[i + 1 < out.size() ? i + 1 : i].find(".json") != std::string::npos)) &&
               i + 1 < out.size()) {
      out[i + 1] = config_path;
      replaced = true;
    }
  }
  if (!replaced) {
    throw UsageError("--autotuning: the program's arguments name no config file; pass it as "
                     "--deepspeed_config ds_config.json (DeepSpeed's autotuner reads the same flag)");
  }
  // Matches DeepSpeed's scheduler: a mapped flag gets the experiment's value ("auto" is left).
  for (const auto& [key, flag] : arg_mappings) {
    const nlohmann::json* v = value_at(ds_config, key);
    if (v == nullptr || v->is_null() || (v->is_string() && v->get<std::string>() == "auto")) continue;
    auto it = std::find(out.begin(), out.end(), flag);
    if (it != out.end() && it + 1 != out.end()) {
      *(it + 1) = scalar_text(*v);
    } else {
      out.push_back(flag);
      out.push_back(scalar_text(*v));
    }
  }
  return out;
}

std::string experiment_command(const ExperimentLaunch& launch, const std::string& config_path,
                               const nlohmann::json& ds_config, int port) {
  return shell_join(experiment_argv(launch, config_path, ds_config, port));
}

std::vector<std::string> experiment_argv(const ExperimentLaunch& launch, const std::string& config_path,
                                         const nlohmann::json& ds_config, int port) {
  std::vector<std::string> words{launch.launcher_path};
  words.insert(words.end(), launch.launcher_flags.begin(), launch.launcher_flags.end());
  words.push_back("--master_port");
  words.push_back(std::to_string(port));
  words.push_back(launch.program);
  for (const auto& a : experiment_program_args(launch.program_args, config_path, ds_config, launch.arg_mappings)) {
    words.push_back(a);
  }
  return words;
}

bool is_out_of_memory_text(const std::string& text) {
  for (const char* marker : {"out of memory", "OutOfMemoryError", "can't allocate memory",
                             "Cannot allocate memory", "std::bad_alloc", "Killed"}) {
    if (text.find(marker) != std::string::npos) return true;
  }
  return false;
}

bool is_port_in_use_text(const std::string& text) {
  return text.find("Address already in use") != std::string::npos ||
         text.find("EADDRINUSE") != std::string::npos;
}

int experiment_port(int master_port, int index, int attempt) {
  constexpr int kFirst = 1024, kLast = 65535;
  const int port = master_port + index + attempt * kExperimentPortRetryStride;
  return kFirst + (port - kFirst) % (kLast - kFirst + 1);
}

ExperimentResult run_experiment(const Experiment& exp, const ExperimentLaunch& launch,
                                const std::string& exps_dir, int index, const std::string& metric_file,
                                const std::string& metric) {
  ExperimentResult r;
  r.dir = (fs::absolute(exps_dir) / exp.name).string();
  fs::create_directories(r.dir);
  const std::string config_path = r.dir + "/ds_config.json";
  write_file(config_path, exp.ds_config.dump(2) + "\n");
  // Another process may hold the experiment's port (an unrelated server, or a client's
  // ephemeral port): rank 0's store cannot listen there and the job fails before it starts.
  // That says nothing about the config, so the experiment runs again on another port.
  nlohmann::json ports_tried = nlohmann::json::array();
  std::string err;
  bool timed_out = false;
  for (int attempt = 0;; ++attempt) {
    const int port = experiment_port(launch.master_port, index, attempt);
    ports_tried.push_back(port);
    const std::string cmd = experiment_command(launch, config_path, exp.ds_config, port);
    write_file(r.dir + "/cmd.txt", cmd + "\n");
    write_file(r.dir + "/exp.json", nlohmann::json{{"name", exp.name},
                                                   {"exp_id", index},
                                                   {"tuning_space", exp.space},
                                                   {"ds_config", exp.ds_config},
                                                   {"master_port", port},
                                                   {"master_ports_tried", ports_tried},
                                                   {"predicted_peak_bytes", exp.predicted_bytes},
                                                   {"result_dir", r.dir}}
                                            .dump(2) + "\n");
    std::remove(metric_file.c_str());
    const std::vector<std::string> argv = experiment_argv(launch, config_path, exp.ds_config, port);
    const auto start = std::chrono::steady_clock::now();
    auto [code, stopped] = run_to_files(argv, launch.env, r.dir + "/stdout.log", r.dir + "/stderr.log",
                                        launch.timeout_s);
    r.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    r.exit_code = code;
    r.master_port = port;
    timed_out = stopped;
    err = read_file(r.dir + "/stderr.log") + read_file(r.dir + "/stdout.log");
    if (code == 0 || timed_out || !is_port_in_use_text(err) || attempt == kExperimentPortAttempts - 1) break;
    log_warning("autotuning: " + exp.name + ": master port " + std::to_string(port) +
                " is in use; running it again on port " +
                std::to_string(experiment_port(launch.master_port, index, attempt + 1)));
  }
  std::ifstream metric_in(metric_file);
  if (r.exit_code == 0 && metric_in) {
    try {
      metric_in >> r.metrics;
      r.status = ExperimentStatus::kOk;
      if (!metric.empty()) r.metric_value = r.metrics.value(metric, 0.0);
      write_file(r.dir + "/metrics.json", r.metrics.dump(2) + "\n");
      return r;
    } catch (const std::exception& e) {
      r.error = std::string("unreadable metric file ") + metric_file + ": " + e.what();
      r.status = ExperimentStatus::kFailed;
      return r;
    }
  }
  r.error = first_error_line(err);
  if (timed_out) {
    r.status = ExperimentStatus::kTimedOut;
    r.error = "stopped after " + std::to_string(static_cast<int>(launch.timeout_s)) + " s";
  } else if (is_out_of_memory_text(err) || r.exit_code == 128 + SIGKILL) {
    r.status = ExperimentStatus::kOutOfMemory;
  } else {
    r.status = ExperimentStatus::kFailed;
    if (r.exit_code == 0) r.error = "the job ended without writing " + metric_file + " (did it run end_profile_step steps?)";
  }
  return r;
}

}  // namespace deepspeed::launcher
