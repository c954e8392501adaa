// The autotuner's flow: see autotuner.h. DeepSpeed's order and names are kept (model info run,
// stages 0..3, spaces z<stage>, experiment names z<stage>_gas<G>_tmbspg<M>, summary.txt,
// ds_config_optimal.json, cmd_optimal.txt); what differs is how few experiments it needs:
//  - a stage whose model states plus one sample's activations exceed the memory per rank is
//    pruned by the engine's own formula, without running it;
//  - the largest micro-batch is predicted from the formula, the measured activation bytes per
//    sample and the model-info run's measured rest, then confirmed with one run (a binary search
//    below it only when that run runs out of memory), instead of DeepSpeed's probe of the
//    minimum, three guesses around a rough estimate and a binary search;
//  - knob configurations that behave alike (bucket sizes past the model size, knobs a stage does
//    not read) are merged and ones predicted not to fit are skipped.
#include "autotuner.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <tuple>

#include "autotuning_experiment.h"
#include "autotuning_space.h"
#include "deepspeed/autotuning_config.h"
#include "deepspeed/config.h"
#include "hostfile.h"
#include "log.h"
#include "resource_filter.h"
#include "usage_error.h"

namespace deepspeed::launcher {
namespace fs = std::filesystem;
namespace {

using nlohmann::json;

struct Record {
  Experiment exp;
  ExperimentResult result;
  double finished_at_s = 0;  // since tuning began
};

std::string mib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f MiB", bytes / (1 << 20));
  return buf;
}

std::string clock_text(double seconds) {
  const long s = std::lround(std::max(0.0, seconds));
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%ld:%02ld:%02ld", s / 3600, (s / 60) % 60, s % 60);
  return buf;
}

std::optional<int64_t> env_int(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  try {
    return std::stoll(v);
  } catch (const std::exception&) {
    throw UsageError(std::string(name) + " is '" + v + "'; expected an integer");
  }
}

int64_t available_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kb = 0;
  while (in >> key >> kb) {
    if (key == "MemAvailable:") return kb * 1024;
    in.ignore(256, '\n');
  }
  return 0;
}

json read_json_file(const std::string& path, const std::string& what) {
  std::ifstream in(path);
  if (!in) throw UsageError("--autotuning: cannot read " + what + " " + path);
  try {
    return json::parse(in);
  } catch (const json::parse_error& e) {
    throw UsageError("--autotuning: " + what + " " + path + " is not valid JSON: " + e.what());
  }
}

std::string bucket_text(const json& v) {
  const double d = v.get<double>();
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%.0e", d);
  std::string s = buf;
  s.erase(std::remove(s.begin(), s.end(), '+'), s.end());
  const auto zero = s.find("e0");
  if (zero != std::string::npos) s.erase(zero + 1, 1);
  return s;
}

// Short names for the knobs in experiment names (DeepSpeed's canonical_name abbreviates too).
std::string knob_suffix(const json& knobs) {
  std::string out;
  for (auto it = knobs.begin(); it != knobs.end(); ++it) {
    std::string abbr;
    for (size_t i = 0; i < it.key().size(); ++i) {
      if (i == 0 || it.key()[i - 1] == '_') abbr += it.key()[i];
    }
    out += "_" + abbr + (it.value().is_boolean() ? std::string(it.value().get<bool>() ? "1" : "0") : bucket_text(it.value()));
  }
  return out;
}

class Autotuner {
 public:
  explicit Autotuner(const AutotuneRequest& request) : request_(request) {
    const std::string config_path = config_path_in_args(request.options.program_args);
    if (config_path.empty()) {
      throw UsageError("--autotuning: the program's arguments name no config file; pass it as "
                       "--deepspeed_config ds_config.json");
    }
    user_ = read_json_file(config_path, "config");
    if (!user_.is_object()) throw UsageError("--autotuning: " + config_path + " must hold a JSON object");
    const json* section = user_.contains("autotuning") ? &user_["autotuning"] : nullptr;
    cfg_ = AutotuningConfig::from_json(section, config_path);
    world_ = std::max(1, request.ranks);
    dp_ = std::max<int64_t>(1, world_ / cfg_.mp_size);
    if (const auto b = env_int("DS_MEMORY_BUDGET_BYTES")) {
      budget_ = *b;
      budget_source_ = "DS_MEMORY_BUDGET_BYTES";
    } else {
      budget_ = available_memory_bytes() / std::max(1, request.ranks_per_host);
      budget_source_ = "available memory / ranks per host";
    }
    launch_.launcher_path = request.launcher_path;
    launch_.launcher_flags = request.launcher_flags;
    launch_.master_port = request.options.master_port;
    launch_.program = request.options.program;
    launch_.program_args = request.options.program_args;
    launch_.arg_mappings = cfg_.arg_mappings;
    launch_.env["DS_LAUNCHER_KILL_GRACE_S"] = "5";  // an OOM'd experiment's peers stop quickly
    launch_.timeout_s = static_cast<double>(env_int("DS_AUTOTUNING_EXPERIMENT_TIMEOUT_S").value_or(1800));
    const json gas = user_.value("gradient_accumulation_steps", json(1));
    user_gas_ = gas.is_number_integer() ? gas.get<int64_t>() : 1;
    if (user_gas_ < 1) user_gas_ = 1;
    // DS_AUTOTUNING_SEARCH=deepspeed: DeepSpeed's own search on the same experiments, for
    // bench/autotuning (how many experiments DeepSpeed's algorithm needs on this machine).
    const char* search = std::getenv("DS_AUTOTUNING_SEARCH");
    deepspeed_search_ = search != nullptr && std::string(search) == "deepspeed";
  }

  int tune_and_maybe_run() {
    prepare_dirs();
    start_ = std::chrono::steady_clock::now();
    log_info("autotuning: " + std::to_string(world_) + " ranks per experiment, memory per rank " +
             mib(static_cast<double>(budget_)) + " (" + budget_source_ + "), metric " + cfg_.metric +
             (cfg_.fast ? ", fast mode (micro-batch sizes per stage)" : ", ZeRO knobs too") +
             ", tuner " + cfg_.tuner_type);
    if (!profile_model()) {
      write_results();
      return 1;
    }
    if (deepspeed_search_) {
      tune_like_deepspeed();
    } else {
      for (int64_t stage : requested_stages()) tune_stage(stage);
    }
    write_results();
    if (best_ < 0) {
      log_error("autotuning: no experiment ran successfully; see " + fs::absolute(cfg_.exps_dir).string());
      return 1;
    }
    if (request_.mode != "run") return 0;
    return run_optimal();
  }

 private:
  // --- configs -------------------------------------------------------------------------------
  std::vector<int64_t> requested_stages() const {
    const json zero = user_.value("zero_optimization", json::object());
    const json stage = zero.is_object() ? zero.value("stage", json(0)) : json(0);
    std::vector<int64_t> out;
    if (stage.is_string()) {
      if (stage.get<std::string>() != "all") {
        throw UsageError("--autotuning: zero_optimization.stage is \"" + stage.get<std::string>() +
                         "\"; expected a stage 0..3, a list of them, or \"all\"");
      }
      out = {0, 1, 2, 3};
    } else if (stage.is_array()) {
      for (const json& s : stage) {
        if (!s.is_number_integer() || s.get<int64_t>() < 0 || s.get<int64_t>() > 3) {
          throw UsageError("--autotuning: zero_optimization.stage contains " + s.dump() + "; expected stages 0..3");
        }
        out.push_back(s.get<int64_t>());
      }
      std::sort(out.begin(), out.end());
      out.erase(std::unique(out.begin(), out.end()), out.end());
    } else if (stage.is_number_integer()) {
      out = {stage.get<int64_t>()};
    } else {
      throw UsageError("--autotuning: zero_optimization.stage is " + stage.dump() + "; expected a stage, a list or \"all\"");
    }
    return out;
  }

  // The user's config with this experiment's stage and batch triad; every other key the user set
  // is kept (Respect the user's fixed keys: DeepSpeed's replace_dict puts them over the space).
  json config_for(int64_t stage, int64_t mbs, int64_t gas, const json& knobs = json::object()) const {
    json c = user_;
    c["train_micro_batch_size_per_gpu"] = mbs;
    c["gradient_accumulation_steps"] = gas;
    c["train_batch_size"] = mbs * gas * dp_;
    json& zero = c["zero_optimization"];
    if (!zero.is_object()) zero = json::object();
    zero["stage"] = stage;
    for (auto it = knobs.begin(); it != knobs.end(); ++it) zero[it.key()] = it.value();
    json a = {{"enabled", true},
              {"start_profile_step", cfg_.start_profile_step},
              {"end_profile_step", cfg_.end_profile_step},
              {"metric", cfg_.metric}};
    c["autotuning"] = a;
    if (cfg_.metric == "flops" && !c.contains("flops_profiler")) {
      c["flops_profiler"] = {{"enabled", true}, {"profile_step", cfg_.start_profile_step}};
    }
    return c;
  }

  int64_t max_mbs_cap() const {
    int64_t cap = cfg_.max_train_micro_batch_size_per_gpu;
    if (cfg_.max_train_batch_size) cap = std::min<int64_t>(cap, *cfg_.max_train_batch_size * cfg_.mp_size / world_);
    return std::max<int64_t>(cap, 1);
  }

  bool better(double a, double b) const { return cfg_.metric == "latency" ? a < b : a > b; }

  // --- running ---------------------------------------------------------------------------------
  const Record& run(Experiment exp, int64_t planned_left) {
    const std::string dir = (fs::absolute(cfg_.exps_dir) / exp.name).string();
    const bool profile = exp.ds_config["autotuning"].contains("model_info");
    const std::string metric_file = dir + (profile ? "/model_info.json" : "/metrics.json");
    exp.ds_config["autotuning"][profile ? "model_info_path" : "metric_path"] = metric_file;
    Record rec{exp, run_experiment(exp, launch_, cfg_.exps_dir, static_cast<int>(records_.size()), metric_file,
                                   profile ? "" : cfg_.metric),
               0};
    rec.finished_at_s = elapsed();
    records_.push_back(rec);
    const Record& r = records_.back();
    ++experiments_run_;
    total_exp_s_ += r.result.wall_s;
    if (r.result.status == ExperimentStatus::kOk && !profile &&
        (best_ < 0 || better(r.result.metric_value, records_[best_].result.metric_value))) {
      best_ = static_cast<int>(records_.size()) - 1;
    }
    progress(r, planned_left);
    return r;
  }

  void progress(const Record& r, int64_t planned_left) {
    std::ostringstream os;
    os << "autotuning: experiment " << experiments_run_ << " of ~" << experiments_run_ + planned_left << " "
       << r.exp.name << ": " << experiment_status_name(r.result.status);
    if (r.result.status == ExperimentStatus::kOk && r.result.metrics.contains("latency")) {
      char buf[96];
      std::snprintf(buf, sizeof(buf), " %s %.2f", cfg_.metric.c_str(), r.result.metric_value);
      os << buf;
    }
    if (r.result.metrics.contains("peak_memory_bytes")) {
      os << " (peak " << mib(r.result.metrics["peak_memory_bytes"].get<double>());
      if (r.exp.predicted_bytes > 0) os << ", predicted " << mib(r.exp.predicted_bytes);
      os << ")";
    }
    if (r.result.status != ExperimentStatus::kOk && !r.result.error.empty()) os << " [" << r.result.error << "]";
    if (best_ >= 0) {
      char buf[160];
      std::snprintf(buf, sizeof(buf), " | best so far %s %.2f", records_[best_].exp.name.c_str(),
                    records_[best_].result.metric_value);
      os << buf;
    }
    const double mean = total_exp_s_ / std::max(1, experiments_run_);
    os << " | elapsed " << clock_text(elapsed()) << ", ETA " << clock_text(mean * planned_left);
    log_info(os.str());
  }

  void record_pruned(Experiment exp, const std::string& why) {
    Record rec{std::move(exp), ExperimentResult{}, elapsed()};
    rec.result.status = ExperimentStatus::kPruned;
    rec.result.error = why;
    log_info("autotuning: pruned " + rec.exp.name + ": " + why);
    records_.push_back(std::move(rec));
  }

  double elapsed() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

  // --- the flow --------------------------------------------------------------------------------
  void prepare_dirs() {
    for (const std::string& d : {cfg_.exps_dir, cfg_.results_dir}) {
      if (cfg_.overwrite && fs::exists(d)) fs::remove_all(d);
      std::error_code ec;
      fs::create_directories(d, ec);
      if (ec) throw UsageError("--autotuning: cannot create " + d + ": " + ec.message());
    }
  }

  // DeepSpeed's model_info_profile_run, at the smallest micro-batch, for two optimizer steps (the
  // second forward is measured: the first also pays one-time buffers). At the lowest stage asked
  // for: its model states have no transient part, so the calibration is the formula's best case.
  bool profile_model() {
    const std::vector<int64_t> stages = requested_stages();
    json c = config_for(stages.front(), cfg_.min_train_micro_batch_size_per_gpu, 1);
    c["autotuning"] = {{"enabled", true}, {"model_info", {{"profile", true}}}};
    Experiment exp{"profile_model_info", "model_info", c, 0};
    // It measures and is no candidate: not held to the memory budget, so that it runs whichever
    // stage turns out to fit (DeepSpeed runs it at ZeRO-3, assumed the smallest, under the GPU's).
    const ExperimentLaunch budgeted = launch_;
    launch_.env["DS_MEMORY_BUDGET_BYTES"] = "";
    const Record& r = run(exp, 1 + static_cast<int64_t>(stages.size()) * (1 + cfg_.num_tuning_micro_batch_sizes));
    launch_ = budgeted;
    if (r.result.status != ExperimentStatus::kOk) {
      log_error("autotuning: the model-information run failed (" +
                std::string(experiment_status_name(r.result.status)) + "): " + r.result.error + "; see " +
                r.result.dir + "/stderr.log");
      return false;
    }
    json profile_config = r.exp.ds_config;
    predictor_.emplace(ModelInfo::from_json(r.result.metrics, profile_config), dp_);
    const ModelInfo& m = predictor_->info();
    log_info("autotuning: the model has " + std::to_string(m.num_params) + " parameters; activations " +
             mib(static_cast<double>(m.activation_bytes_per_sample)) + " per sample; the rest of the process " +
             mib(static_cast<double>(predictor_->overhead_bytes())) + " (model-information run at ZeRO-" +
             std::to_string(stages.front()) + ", peak " + mib(static_cast<double>(m.peak_bytes)) + ")");
    return true;
  }

  std::string mbs_name(int64_t stage, int64_t gas, int64_t mbs) const {
    return "z" + std::to_string(stage) + "_gas" + std::to_string(gas) + "_tmbspg" + std::to_string(mbs);
  }

  // Runs one micro-batch size at `stage` unless already run; returns its record index.
  int run_mbs(int64_t stage, int64_t mbs, int64_t gas, int64_t planned_left) {
    const std::string name = mbs_name(stage, gas, mbs);
    for (size_t i = 0; i < records_.size(); ++i) {
      if (records_[i].exp.name == name) return static_cast<int>(i);
    }
    json c = config_for(stage, mbs, gas);
    Experiment exp{name, "z" + std::to_string(stage), c, static_cast<double>(predictor_->predict(c))};
    run(exp, planned_left);
    return static_cast<int>(records_.size()) - 1;
  }

  void tune_stage(int64_t stage) {
    const std::string space = "z" + std::to_string(stage);
    const int64_t min_mbs = cfg_.min_train_micro_batch_size_per_gpu;
    json c1 = config_for(stage, min_mbs, user_gas_);
    const int64_t need = predictor_->predict(c1);
    if (need > budget_) {
      Experiment exp{mbs_name(stage, user_gas_, min_mbs), space, c1, static_cast<double>(need)};
      record_pruned(exp, "ZeRO-" + std::to_string(stage) + " needs " + mib(static_cast<double>(need)) +
                             " per rank at micro-batch " + std::to_string(min_mbs) + " (model states " +
                             mib(static_cast<double>(predictor_->model_state_bytes(c1))) + " by the engine's formula), over the " +
                             mib(static_cast<double>(budget_)) + " per rank");
      return;
    }
    const int64_t predicted_max = std::min(max_mbs_cap(), predictor_->max_micro_batch(c1, budget_));
    // Matches DeepSpeed: a stage whose largest micro-batch is below an earlier stage's is not tuned
    // (it can only add communication at a smaller batch).
    if (predicted_max < prev_max_mbs_) {
      log_info("autotuning: no need to tune ZeRO-" + std::to_string(stage) + ": its largest micro-batch (" +
               std::to_string(predicted_max) + ") is below ZeRO-" + std::to_string(prev_stage_) + "'s (" +
               std::to_string(prev_max_mbs_) + ")");
      return;
    }
    const int64_t per_stage = 1 + cfg_.num_tuning_micro_batch_sizes;
    std::vector<int64_t> sizes;
    int64_t max_tbs_per_gpu = 0;
    const json& user_mbs = user_.value("train_micro_batch_size_per_gpu", json());
    if (user_mbs.is_array()) {
      // Matches DeepSpeed: a list of micro-batch sizes replaces the search.
      for (const json& v : user_mbs) {
        if (v.is_number_integer()) sizes.push_back(v.get<int64_t>());
      }
      std::sort(sizes.begin(), sizes.end());
      max_tbs_per_gpu = sizes.back() * user_gas_;
    } else {
      // The largest micro-batch: predicted, confirmed by one run; below it only if that fails.
      int64_t max_mbs = 0;
      int64_t lo = min_mbs, hi = predicted_max;
      const Record* first = &records_[run_mbs(stage, predicted_max, user_gas_, per_stage)];
      if (first->result.status == ExperimentStatus::kOk) {
        max_mbs = predicted_max;
      } else {
        hi = predicted_max - 1;
        while (lo <= hi) {
          const int64_t mid = (lo + hi) / 2;
          const Record& r = records_[run_mbs(stage, mid, user_gas_, per_stage)];
          if (r.result.status == ExperimentStatus::kOk) {
            max_mbs = mid;
            lo = mid + 1;
          } else {
            hi = mid - 1;
          }
        }
      }
      if (max_mbs == 0) {
        log_info("autotuning: ZeRO-" + std::to_string(stage) + " runs with no micro-batch size");
        return;
      }
      prev_max_mbs_ = std::max(prev_max_mbs_, max_mbs);
      prev_stage_ = stage;
      max_tbs_per_gpu = cfg_.max_train_batch_size ? *cfg_.max_train_batch_size * cfg_.mp_size / world_
                                                  : max_mbs * user_gas_ / cfg_.mp_size;
      sizes = tuning_micro_batch_sizes(min_mbs, max_mbs, cfg_.num_tuning_micro_batch_sizes, max_tbs_per_gpu);
    }
    int best_in_stage = -1;
    for (size_t i = 0; i < sizes.size(); ++i) {
      const int64_t mbs = sizes[i];
      const int64_t gas = std::max<int64_t>(1, max_tbs_per_gpu / mbs);
      const int idx = run_mbs(stage, mbs, gas, static_cast<int64_t>(sizes.size() - i - 1));
      const Record& r = records_[idx];
      if (r.result.status == ExperimentStatus::kOk &&
          (best_in_stage < 0 || better(r.result.metric_value, records_[best_in_stage].result.metric_value))) {
        best_in_stage = idx;
      }
    }
    // Also the sizes run while searching count for the stage's best.
    for (size_t i = 0; i < records_.size(); ++i) {
      const Record& r = records_[i];
      if (r.exp.space == space && r.result.status == ExperimentStatus::kOk &&
          (best_in_stage < 0 || better(r.result.metric_value, records_[best_in_stage].result.metric_value))) {
        best_in_stage = static_cast<int>(i);
      }
    }
    if (cfg_.fast || stage == 0 || best_in_stage < 0) return;
    tune_knobs(stage, records_[best_in_stage]);
  }

  // The stage's ZeRO knobs at its best micro-batch (fast: false).
  void tune_knobs(int64_t stage, Record best_mbs) {
    const json& bc = best_mbs.exp.ds_config;
    const int64_t mbs = bc["train_micro_batch_size_per_gpu"].get<int64_t>();
    const int64_t gas = bc["gradient_accumulation_steps"].get<int64_t>();
    const std::vector<json> knobs = zero_knob_configs(stage, user_.value("zero_optimization", json::object()),
                                                      predictor_->info().num_params);
    const std::string space = "z" + std::to_string(stage) + "_knobs";
    std::vector<json> candidates;
    std::vector<Experiment> exps;
    for (const json& k : knobs) {
      json c = config_for(stage, mbs, gas, k);
      Experiment exp{mbs_name(stage, gas, mbs) + knob_suffix(k), space, c, static_cast<double>(predictor_->predict(c))};
      if (exp.predicted_bytes > budget_) {
        record_pruned(exp, "predicted " + mib(exp.predicted_bytes) + " per rank, over the " + mib(static_cast<double>(budget_)));
        continue;
      }
      candidates.push_back(k);
      exps.push_back(exp);
    }
    TunerOrder order(cfg_.tuner_type, candidates);
    std::vector<std::pair<size_t, double>> measured;
    int64_t since_better = 0;
    double space_best = best_mbs.result.metric_value;
    const int64_t trials = std::min<int64_t>(cfg_.tuner_num_trials, static_cast<int64_t>(exps.size()));
    for (int64_t t = 0; t < trials; ++t) {
      const auto next = order.next(measured);
      if (!next) break;
      const Record& r = run(exps[*next], trials - t - 1);
      const bool ok = r.result.status == ExperimentStatus::kOk;
      const double v = ok ? r.result.metric_value : 0.0;
      measured.emplace_back(*next, cfg_.metric == "latency" ? (ok ? -v : -1e30) : v);
      if (ok && better(v, space_best)) {
        space_best = v;
        since_better = 0;
      } else if (++since_better >= cfg_.tuner_early_stopping) {
        log_info("autotuning: " + space + ": no better configuration in " + std::to_string(since_better) +
                 " trials (tuner_early_stopping); moving on");
        break;
      }
    }
  }

  // --- results ---------------------------------------------------------------------------------
  void write_results() {
    const fs::path results = fs::absolute(cfg_.results_dir);
    // DeepSpeed's table: one row per tuning space, and the global best.
    std::map<std::string, std::pair<int, int>> spaces;  // space -> (experiments, best record)
    std::vector<std::string> order;
    for (size_t i = 0; i < records_.size(); ++i) {
      const Record& r = records_[i];
      if (r.exp.space == "model_info") continue;
      auto [it, inserted] = spaces.emplace(r.exp.space, std::make_pair(0, -1));
      if (inserted) order.push_back(r.exp.space);
      if (r.result.status != ExperimentStatus::kPruned) it->second.first += 1;
      if (r.result.status == ExperimentStatus::kOk &&
          (it->second.second < 0 || better(r.result.metric_value, records_[it->second.second].result.metric_value))) {
        it->second.second = static_cast<int>(i);
      }
    }
    std::ostringstream os;
    char line[512];
    std::snprintf(line, sizeof(line), "| %-14s | %15s | %15s | %-40s |\n", "tuning_space", "num_experiments",
                  "best_metric_val", "best_exp_name");
    os << line << "|:" << std::string(15, '-') << "|" << std::string(16, '-') << ":|" << std::string(16, '-')
       << ":|:" << std::string(41, '-') << "|\n";
    int total = 0;
    for (const auto& s : order) {
      const auto& [n, b] = spaces[s];
      total += n;
      std::snprintf(line, sizeof(line), "| %-14s | %15d | %15.4g | %-40s |\n", s.c_str(), n,
                    b >= 0 ? records_[b].result.metric_value : 0.0, b >= 0 ? records_[b].exp.name.c_str() : "-");
      os << line;
    }
    std::snprintf(line, sizeof(line), "| %-14s | %15d | %15.4g | %-40s |\n", "global", total,
                  best_ >= 0 ? records_[best_].result.metric_value : 0.0,
                  best_ >= 0 ? records_[best_].exp.name.c_str() : "-");
    os << line << "\n";
    // Every experiment, in the order run.
    std::snprintf(line, sizeof(line), "%-3s %-44s %-14s %12s %14s %14s %9s\n", "#", "experiment", "status",
                  cfg_.metric.c_str(), "peak", "predicted", "wall s");
    os << line;
    for (size_t i = 0; i < records_.size(); ++i) {
      const Record& r = records_[i];
      const json& m = r.result.metrics;
      std::snprintf(line, sizeof(line), "%-3zu %-44s %-14s %12.4g %14s %14s %9.1f\n", i, r.exp.name.c_str(),
                    experiment_status_name(r.result.status), r.result.metric_value,
                    m.contains("peak_memory_bytes") ? mib(m["peak_memory_bytes"].get<double>()).c_str() : "-",
                    r.exp.predicted_bytes > 0 ? mib(r.exp.predicted_bytes).c_str() : "-", r.result.wall_s);
      os << line;
    }
    const double best_at = best_ >= 0 ? records_[best_].finished_at_s : 0.0;
    const int best_index = [&] {
      int n = 0;
      for (int i = 0; i <= best_ && best_ >= 0; ++i) n += records_[i].result.status != ExperimentStatus::kPruned;
      return n;
    }();
    os << "\nTuning completed in " << clock_text(elapsed()) << ". Total number of experiments: " << experiments_run_
       << " (the model-information run included); memory per rank " << mib(static_cast<double>(budget_)) << ".\n";
    if (best_ >= 0) {
      os << "The best configuration, " << records_[best_].exp.name << ", was experiment " << best_index << " of "
         << experiments_run_ << ", found after " << clock_text(best_at) << ".\n";
    }
    std::ofstream(results / "summary.txt") << os.str();
    std::fputs(os.str().c_str(), stdout);
    std::fflush(stdout);

    json all = json::array();
    for (const Record& r : records_) {
      all.push_back({{"name", r.exp.name},
                     {"tuning_space", r.exp.space},
                     {"status", experiment_status_name(r.result.status)},
                     {"metric", r.result.metric_value},
                     {"metrics", r.result.metrics},
                     {"predicted_peak_bytes", r.exp.predicted_bytes},
                     {"wall_s", r.result.wall_s},
                     {"master_port", r.result.master_port > 0 ? json(r.result.master_port) : json()},
                     {"finished_at_s", r.finished_at_s},
                     {"error", r.result.error},
                     {"ds_config", r.exp.ds_config}});
    }
    json summary = {{"metric", cfg_.metric},
                    {"memory_per_rank_bytes", budget_},
                    {"experiments", all},
                    {"num_experiments", experiments_run_},
                    {"tuning_s", elapsed()},
                    {"best", best_ >= 0 ? json(records_[best_].exp.name) : json()},
                    {"best_experiment_number", best_index},
                    {"best_found_at_s", best_at}};
    std::ofstream(results / "autotuning_results.json") << summary.dump(2) << "\n";
    if (best_ < 0) return;
    json optimal = records_[best_].exp.ds_config;
    optimal.erase("autotuning");
    const std::string optimal_path = (results / "ds_config_optimal.json").string();
    std::ofstream(optimal_path) << optimal.dump(2) << "\n";
    ExperimentLaunch job = launch_;
    std::ofstream(results / "cmd_optimal.txt")
        << experiment_command(job, optimal_path, optimal, request_.options.master_port) << "\n";
    log_info("autotuning: " + records_[best_].exp.name + " is the optimal setup; wrote " + optimal_path + " and " +
             (results / "cmd_optimal.txt").string());
  }

  // `run`: DeepSpeed's run_after_tuning, the job with ds_config_optimal.json.
  int run_optimal() {
    const fs::path results = fs::absolute(cfg_.results_dir);
    json optimal = read_json_file((results / "ds_config_optimal.json").string(), "optimal config");
    std::vector<std::string> argv =
        experiment_argv(launch_, (results / "ds_config_optimal.json").string(), optimal, request_.options.master_port);
    log_info("autotuning: running with the optimal configuration: " + experiment_command(launch_,
             (results / "ds_config_optimal.json").string(), optimal, request_.options.master_port));
    std::fflush(stdout);
    const pid_t pid = ::fork();
    if (pid == 0) {
      std::vector<char*> args;
      for (auto& a : argv) args.push_back(a.data());
      args.push_back(nullptr);
      ::execv(args[0], args.data());
      ::_exit(127);
    }
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  // --- DeepSpeed's search (autotuner.py), for comparison -----------------------------------------
  // Its memory estimate: parameters, gradients and Adam states per stage (no buffers), with the
  // activation bytes per sample of the model-information run.
  int64_t deepspeed_instantiation_bytes(int64_t stage) const {
    const int64_t psi = predictor_->info().num_params;
    const bool half = user_.contains("fp16") && user_["fp16"].value("enabled", false);
    double params = psi * (half ? 2.0 : 4.0), grads = params, optim = psi * (half ? 16.0 : 8.0);
    if (stage >= 1) optim /= dp_;
    if (stage >= 2) grads /= dp_;
    if (stage >= 3) params /= dp_;
    return static_cast<int64_t>((params + grads + optim) / cfg_.mp_size);
  }

  void tune_like_deepspeed() {
    const int64_t act = std::max<int64_t>(1, predictor_->info().activation_bytes_per_sample);
    int64_t max_mbs = 0, mbs = 0;
    double metric = 0;
    for (int64_t stage : requested_stages()) {
      if (budget_ <= deepspeed_instantiation_bytes(stage) + act) {
        log_info("autotuning (DeepSpeed's search): ZeRO-" + std::to_string(stage) + " is not runnable by its estimate");
        continue;
      }
      auto [next_max, next_mbs, next_metric] = deepspeed_tune_space(stage, max_mbs, mbs, metric);
      if (next_mbs > mbs) {
        mbs = next_mbs;
        max_mbs = next_max;
        metric = next_metric;
      }
    }
  }

  // Returns the index of the run's record and whether it succeeded (DeepSpeed: metric_val).
  std::pair<bool, double> ds_run(int64_t stage, int64_t m, int64_t gas) {
    const Record& r = records_[run_mbs(stage, m, gas, 1)];
    return {r.result.status == ExperimentStatus::kOk, r.result.metric_value};
  }

  std::tuple<int64_t, int64_t, double> deepspeed_tune_space(int64_t stage, int64_t prev_max_mbs, int64_t prev_best_mbs,
                                                            double prev_best_metric) {
    const int64_t act = std::max<int64_t>(1, predictor_->info().activation_bytes_per_sample);
    const int64_t calculated_max = (budget_ - deepspeed_instantiation_bytes(stage)) / act;
    if (calculated_max < prev_max_mbs) return {0, 0, 0};
    // get_min_max_micro_batch_size
    int64_t min_mbs = prev_max_mbs, max_mbs = -1;
    std::vector<int64_t> used;
    const int64_t gas = user_gas_;
    if (min_mbs > calculated_max) return {0, 0, 0};
    if (min_mbs < 1) {
      const json& u = user_.value("train_micro_batch_size_per_gpu", json(1));
      int64_t m = u.is_number_integer() ? u.get<int64_t>() : 1;
      auto [ok, v] = ds_run(stage, m, gas);
      if (!ok) {
        if (cfg_.min_train_micro_batch_size_per_gpu == m) return {0, 0, 0};
        m = cfg_.min_train_micro_batch_size_per_gpu;
        if (!ds_run(stage, m, gas).first) return {0, 0, 0};
      }
      used.push_back(m);
      min_mbs = m;
    } else {
      if (!ds_run(stage, min_mbs, gas).first) return {0, 0, 0};
      used.push_back(min_mbs);
    }
    const int64_t cap = cfg_.max_train_micro_batch_size_per_gpu;
    max_mbs = std::min(calculated_max, max_mbs_cap());
    bool found = false;
    for (int64_t m : {static_cast<int64_t>(std::ceil(1.05 * max_mbs)), max_mbs, static_cast<int64_t>(0.95 * max_mbs)}) {
      if (m > cap) continue;
      if (std::find(used.begin(), used.end(), m) != used.end()) {
        max_mbs = m;
        found = true;
        break;
      }
      if (ds_run(stage, m, gas).first) {
        used.push_back(m);
        max_mbs = m;
        found = true;
        break;
      }
    }
    if (!found) {
      // Binary search, stopping early when the metric plateaus (METRIC_PERCENT_DIFF_CONST 5%).
      int64_t low = min_mbs, high = max_mbs;
      std::optional<double> prev_metric;
      while (low <= high) {
        const int64_t mid = (low + high) / 2;
        if (std::find(used.begin(), used.end(), mid) != used.end()) {
          low = mid + 1;
          continue;
        }
        auto [ok, v] = ds_run(stage, mid, gas);
        if (ok) {
          low = mid + 1;
          used.push_back(mid);
          if (prev_metric && (v - *prev_metric) / *prev_metric < 0.05) break;
          prev_metric = v;
        } else {
          high = mid - 1;
        }
      }
      max_mbs = low - 1;
    }
    if (max_mbs < prev_max_mbs || max_mbs < 1) return {0, 0, 0};
    const int64_t max_tbs_per_gpu = cfg_.max_train_batch_size ? *cfg_.max_train_batch_size * cfg_.mp_size / world_
                                                              : max_mbs * user_gas_ / cfg_.mp_size;
    std::vector<int64_t> sizes =
        tuning_micro_batch_sizes(min_mbs, max_mbs, cfg_.num_tuning_micro_batch_sizes, max_tbs_per_gpu);
    double max_metric = 0;
    for (int64_t m : sizes) {
      auto [ok, v] = ds_run(stage, m, std::max<int64_t>(1, max_tbs_per_gpu / m));
      if (ok && m == max_mbs) max_metric = v;
    }
    // run_tuning_micro_batch_sizes' refinement below the largest size, same accumulation.
    const int64_t low_same_gas = sizes.size() > 1 ? sizes[sizes.size() - 2] + 1 : min_mbs;
    int64_t stride = std::max<int64_t>(1, (max_mbs - low_same_gas) / 3);
    double best_metric = max_metric;
    for (int64_t m = low_same_gas + ((max_mbs - 1 - low_same_gas) / stride) * stride; m >= low_same_gas && m < max_mbs;
         m -= stride) {
      auto [ok, v] = ds_run(stage, m, std::max<int64_t>(1, max_tbs_per_gpu / m));
      if (!ok || v <= best_metric * 1.05) break;
      best_metric = v;
    }
    // The stage's best (DeepSpeed returns it to compare stages).
    int64_t best_mbs = 0;
    double best = 0;
    for (const Record& r : records_) {
      if (r.exp.space == "z" + std::to_string(stage) && r.result.status == ExperimentStatus::kOk &&
          r.result.metric_value > best) {
        best = r.result.metric_value;
        best_mbs = r.exp.ds_config["train_micro_batch_size_per_gpu"].get<int64_t>();
      }
    }
    (void)prev_best_mbs;
    (void)prev_best_metric;
    return {max_mbs, best_mbs, best};
  }

  bool deepspeed_search_ = false;
  const AutotuneRequest& request_;
  json user_;
  AutotuningConfig cfg_;
  int world_ = 1;
  int64_t dp_ = 1;
  int64_t budget_ = 0;
  std::string budget_source_;
  int64_t user_gas_ = 1;
  ExperimentLaunch launch_;
  std::optional<MemoryPredictor> predictor_;
  std::vector<Record> records_;
  int best_ = -1;
  int experiments_run_ = 0;
  double total_exp_s_ = 0;
  int64_t prev_max_mbs_ = 0;
  int64_t prev_stage_ = 0;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace

std::vector<std::string> launcher_flags_without_autotuning(const std::vector<std::string>& args,
                                                           size_t program_arg_count) {
  std::vector<std::string> out;
  const size_t end = args.size() >= program_arg_count ? args.size() - program_arg_count : 0;
  for (size_t i = 0; i < end; ++i) {
    if (args[i] == "--autotuning") {
      ++i;
      continue;
    }
    if (args[i].rfind("--autotuning=", 0) == 0) continue;
    if (args[i] == "--") continue;
    if (args[i] == "--master_port") {  // each experiment gets its own port
      ++i;
      continue;
    }
    if (args[i].rfind("--master_port=", 0) == 0) continue;
    out.push_back(args[i]);
  }
  return out;
}

std::string self_executable_path() {
  std::error_code ec;
  const fs::path p = fs::read_symlink("/proc/self/exe", ec);
  if (ec) throw std::runtime_error("--autotuning: cannot find this launcher's path (/proc/self/exe): " + ec.message());
  return p.string();
}

std::pair<int, int> autotuning_world(const LauncherOptions& o, const HostInfo& host) {
  if (std::optional<ResourcePool> pool = read_hostfile(o.hostfile)) {
    const WorldInfo world = select_resources(*pool, ResourceRequest{o.include, o.exclude, o.num_nodes, o.num_gpus});
    int most = 1;
    for (const NodeSlots& n : world) most = std::max(most, static_cast<int>(n.slots.size()));
    return {std::max(1, world_size(world)), most};
  }
  const int n = o.num_gpus > 0 ? o.num_gpus : (host.gpu_count > 0 ? host.gpu_count : 1);
  return {n, n};
}

int run_autotuning(const AutotuneRequest& request) {
  Autotuner tuner(request);
  return tuner.tune_and_maybe_run();
}

}  // namespace deepspeed::launcher
