// LR schedule formulas (reference §4), each a pure function of k.
#include "deepspeed/lr_schedules.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "util/check.h"

namespace deepspeed::optim {
namespace {

constexpr double kPi = 3.14159265358979323846;

struct ParamReader {
  const json& params;
  std::string base;
  std::vector<std::string> known;

  const json* raw(const std::string& k) {
    known.push_back(k);
    auto it = params.find(k);
    if (it == params.end() || it->is_null()) return nullptr;
    if (it->is_string() && it->get<std::string>() == "auto") return nullptr;
    return &*it;
  }
  double number(const std::string& k, double def) {
    const json* v = raw(k);
    if (v == nullptr) return def;
    DS_CHECK(v->is_number(), ConfigError, base, k, " is ", v->dump(), "; expected a number");
    return v->get<double>();
  }
  std::optional<double> opt_number(const std::string& k) {
    const json* v = raw(k);
    if (v == nullptr) return std::nullopt;
    DS_CHECK(v->is_number(), ConfigError, base, k, " is ", v->dump(), "; expected a number");
    return v->get<double>();
  }
  int64_t positive_int(const std::string& k, int64_t def) {
    const json* v = raw(k);
    if (v == nullptr) return def;
    DS_CHECK(v->is_number_integer() && v->get<int64_t>() > 0, ConfigError, base, k, " is ",
             v->dump(), "; expected a positive integer");
    return v->get<int64_t>();
  }
  bool boolean(const std::string& k, bool def) {
    const json* v = raw(k);
    if (v == nullptr) return def;
    DS_CHECK(v->is_boolean(), ConfigError, base, k, " is ", v->dump(), "; expected true or false");
    return v->get<bool>();
  }
  std::string warmup_type(const std::string& k) {
    const json* v = raw(k);
    if (v == nullptr) return "log";
    DS_CHECK(v->is_string(), ConfigError, base, k, " is ", v->dump(),
             "; expected \"log\" or \"linear\"");
    std::string s = v->get<std::string>();
    DS_CHECK(s == "log" || s == "linear", ConfigError, base, k, " is \"", s,
             "\"; expected \"log\" or \"linear\"");
    return s;
  }
  void finish(const std::string& type) {
    for (auto it = params.begin(); it != params.end(); ++it) {
      DS_CHECK(std::find(known.begin(), known.end(), it.key()) != known.end(), ConfigError, base,
               it.key(), " is not a parameter of ", type);
    }
  }
};

// Warm-up fraction gamma(k) shared by WarmupLR / WarmupDecayLR / WarmupCosineLR.
double warmup_gamma(int64_t k, int64_t n, bool log_type) {
  if (k < 0) return 0.0;
  if (k >= n) return 1.0;
  return log_type ? std::log(static_cast<double>(k + 1)) / std::log(static_cast<double>(n))
                  : static_cast<double>(k) / static_cast<double>(n);
}

LrFunction build(const SchedulerConfig& config, const std::string& source) {
  ParamReader r{config.params, source + ": scheduler.params.", {}};
  const std::string& type = config.type;
  if (type == "WarmupLR" || type == "WarmupDecayLR") {
    const bool decay = type == "WarmupDecayLR";
    double min_lr = r.number("warmup_min_lr", 0.0);
    // WarmupLR: None means each group's own lr (since DeepSpeed 0.17.2); WarmupDecayLR: 0.001.
    std::optional<double> max_lr = r.opt_number("warmup_max_lr");
    if (decay && !max_lr) max_lr = 0.001;
    int64_t n = std::max<int64_t>(2, r.positive_int("warmup_num_steps", 1000));
    bool log_type = r.warmup_type("warmup_type") == "log";
    int64_t total = 0;
    if (decay) {
      const json* t = r.raw("total_num_steps");
      DS_CHECK(t != nullptr, ConfigError, source,
               ": scheduler.params.total_num_steps is required by WarmupDecayLR");
      DS_CHECK(t->is_number_integer() && t->get<int64_t>() > 0, ConfigError, source,
               ": scheduler.params.total_num_steps is ", t->dump(),
               "; expected a positive integer");
      total = t->get<int64_t>();
    }
    r.finish(type);
    return [=](int64_t k, double base) {
      double hi = max_lr.value_or(base);
      double gamma = warmup_gamma(k, n, log_type);
      if (decay && k >= n) {
        gamma = std::max(0.0, static_cast<double>(total - k) /
                                  static_cast<double>(std::max<int64_t>(1, total - n)));
      }
      return min_lr + (hi - min_lr) * gamma;
    };
  }
  if (type == "WarmupCosineLR") {
    const json* t = r.raw("total_num_steps");
    DS_CHECK(t != nullptr && t->is_number_integer() && t->get<int64_t>() > 0, ConfigError, source,
             ": scheduler.params.total_num_steps is required by WarmupCosineLR as a positive "
             "integer");
    int64_t total = t->get<int64_t>();
    double wmin = r.number("warmup_min_ratio", 0.0);
    int64_t n = r.positive_int("warmup_num_steps", 1000);
    double cmin = r.number("cos_min_ratio", 1e-4);
    bool log_type = r.warmup_type("warmup_type") == "log";
    r.finish(type);
    return [=](int64_t k, double base) {
      double ratio;
      if (k < 0) {
        ratio = 0.0;  // Matches DeepSpeed: construction sets lr = 0
      } else if (k < n) {
        double w = log_type ? std::log(static_cast<double>(k + 1)) / std::log(static_cast<double>(n))
                            : static_cast<double>(k) / static_cast<double>(n);
        ratio = wmin + w * (1.0 - wmin);
      } else {
        double p = std::min(1.0, static_cast<double>(k - n + 1) /
                                     static_cast<double>(std::max<int64_t>(1, total - n)));
        ratio = std::max(0.0, cmin + (1.0 - cmin) * (1.0 + std::cos(kPi * p)) / 2.0);
      }
      return base * ratio;
    };
  }
  if (type == "LRRangeTest") {
    double min_lr = r.number("lr_range_test_min_lr", 1e-3);
    int64_t step_size = r.positive_int("lr_range_test_step_size", 2000);
    double rate = r.number("lr_range_test_step_rate", 1.0);
    bool staircase = r.boolean("lr_range_test_staircase", false);
    r.finish(type);
    return [=](int64_t k, double /*base*/) {
      double interval = static_cast<double>(k + 1) / static_cast<double>(step_size);
      if (staircase) interval = std::floor(interval);
      return min_lr * (1.0 + rate * interval);
    };
  }
  DS_CHECK(type != "OneCycle", NotSupportedError, source,
           ": scheduler.type \"OneCycle\" is not supported yet (supported: WarmupLR, "
           "WarmupDecayLR, WarmupCosineLR, LRRangeTest)");
  for (const char* torch_name : {"StepLR", "MultiStepLR", "ExponentialLR", "CosineAnnealingLR",
                                 "LambdaLR", "LinearLR", "ConstantLR", "OneCycleLR", "CyclicLR",
                                 "PolynomialLR", "ReduceLROnPlateau", "CosineAnnealingWarmRestarts",
                                 "SequentialLR", "ChainedScheduler", "MultiplicativeLR"}) {
    DS_CHECK(type != torch_name, NotSupportedError, source, ": scheduler.type \"", type,
             "\" (torch.optim.lr_scheduler) is not supported yet");
  }
  throw ConfigError(source + ": DeepSpeed does not recognize LR scheduler \"" + type +
                    "\" (scheduler.type; known: WarmupLR, WarmupDecayLR, WarmupCosineLR, "
                    "LRRangeTest, OneCycle)");
}

}  // namespace

void check_scheduler_supported(const SchedulerConfig& config, const std::string& source) {
  (void)build(config, source);
}

LrFunction make_lr_function(const SchedulerConfig& config, const std::string& source) {
  return build(config, source);
}

LRScheduler::LRScheduler(LrFunction fn, std::vector<double> base_lrs,
                         std::function<void(size_t, double)> set_lr)
    : fn_(std::move(fn)), base_lrs_(std::move(base_lrs)), set_lr_(std::move(set_lr)) {
  apply();  // k = -1: the value DeepSpeed writes at construction
}

void LRScheduler::step() {
  ++last_batch_iteration_;
  apply();
}

void LRScheduler::apply() {
  last_lrs_.resize(base_lrs_.size());
  for (size_t g = 0; g < base_lrs_.size(); ++g) {
    last_lrs_[g] = fn_(last_batch_iteration_, base_lrs_[g]);
    set_lr_(g, last_lrs_[g]);
  }
}

json LRScheduler::state_dict() const { return {{"last_batch_iteration", last_batch_iteration_}}; }

void LRScheduler::load_state_dict(const json& state) {
  DS_CHECK(state.contains("last_batch_iteration") && state["last_batch_iteration"].is_number_integer(),
           CheckpointError, "lr_scheduler state has no integer 'last_batch_iteration': ", state.dump());
  last_batch_iteration_ = state["last_batch_iteration"].get<int64_t>();
  apply();
}

}  // namespace deepspeed::optim
