// LR schedule formulas (reference §4), each a pure function of k, and LRScheduler. OneCycle is
// in one_cycle.cpp; binding a schedule to an optimizer in lr_scheduler_factory.cpp.
#include "deepspeed/lr_schedules.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "runtime/optim/schedule_params.h"
#include "util/check.h"
#include "util/logging.h"

namespace deepspeed::optim {
namespace {

constexpr double kPi = 3.14159265358979323846;

// Warm-up fraction gamma(k) shared by WarmupLR / WarmupDecayLR / WarmupCosineLR.
double warmup_gamma(int64_t k, int64_t n, bool log_type) {
  if (k < 0) return 0.0;
  if (k >= n) return 1.0;
  return log_type ? std::log(static_cast<double>(k + 1)) / std::log(static_cast<double>(n))
                  : static_cast<double>(k) / static_cast<double>(n);
}

int64_t total_num_steps(detail::ScheduleParams& r, const std::string& type) {
  const json* t = r.raw("total_num_steps");
  DS_CHECK(t != nullptr, ConfigError, r.where("total_num_steps"), " is required by ", type);
  DS_CHECK(t->is_number_integer() && t->get<int64_t>() > 0, ConfigError,
           r.where("total_num_steps"), " is ", t->dump(), "; expected a positive integer");
  return t->get<int64_t>();
}

LrSchedule warmup(detail::ScheduleParams& r, bool decay) {
  detail::PerGroup min_lr = r.per_group("warmup_min_lr", 0.0);
  // WarmupLR: None means each group's own lr (since DeepSpeed 0.17.2); WarmupDecayLR: 0.001.
  std::optional<detail::PerGroup> max_lr = r.opt_per_group("warmup_max_lr");
  if (decay && !max_lr) max_lr = detail::PerGroup{{0.001}};
  const int64_t n_given = r.positive_int("warmup_num_steps", 1000);
  const int64_t n = std::max<int64_t>(2, n_given);
  const bool log_type = r.warmup_is_log("warmup_type");
  int64_t total = 0;
  if (decay) {
    total = total_num_steps(r, "WarmupDecayLR");
    if (total < n_given) {
      r.warn("scheduler: total_num_steps " + std::to_string(total) +
             " is less than warmup_num_steps " + std::to_string(n_given));
    }
  }
  LrSchedule s;
  s.lr = [=](int64_t k, size_t g, double base) {
    const double lo = min_lr.at(g);
    const double hi = max_lr ? max_lr->at(g) : base;
    double gamma = warmup_gamma(k, n, log_type);
    if (decay && k >= n) {
      gamma = std::max(0.0, static_cast<double>(total - k) /
                                static_cast<double>(std::max<int64_t>(1, total - n)));
    }
    return lo + (hi - lo) * gamma;
  };
  return s;
}

LrSchedule warmup_cosine(detail::ScheduleParams& r) {
  const int64_t total = total_num_steps(r, "WarmupCosineLR");
  const double wmin = r.number("warmup_min_ratio", 0.0);
  const int64_t n_given = r.positive_int("warmup_num_steps", 1000);
  const int64_t n = std::max<int64_t>(2, n_given);
  const double cmin = r.number("cos_min_ratio", 1e-4);
  const bool log_type = r.warmup_is_log("warmup_type");
  if (total < n_given) {
    r.warn("scheduler: total_num_steps " + std::to_string(total) +
           " is less than warmup_num_steps " + std::to_string(n_given));
  }
  LrSchedule s;
  s.lr = [=](int64_t k, size_t, double base) {
    double ratio;
    if (k < 0) {
      ratio = 0.0;  // Matches DeepSpeed: construction sets lr = 0
    } else if (k < n) {
      ratio = wmin + warmup_gamma(k, n, log_type) * (1.0 - wmin);
    } else {
      // Progress clamped to 1: past the end the lr stays at base * cos_min_ratio.
      double p = std::min(1.0, static_cast<double>(k - n + 1) /
                                   static_cast<double>(std::max<int64_t>(1, total - n)));
      ratio = std::max(0.0, cmin + (1.0 - cmin) * (1.0 + std::cos(kPi * p)) / 2.0);
    }
    return base * ratio;
  };
  return s;
}

LrSchedule range_test(detail::ScheduleParams& r) {
  detail::PerGroup min_lr = r.per_group("lr_range_test_min_lr", 1e-3);
  const int64_t step_size = r.positive_int("lr_range_test_step_size", 2000);
  const double rate = r.number("lr_range_test_step_rate", 1.0);
  const bool staircase = r.boolean("lr_range_test_staircase", false);
  LrSchedule s;
  s.lr = [=](int64_t k, size_t g, double) {
    double interval = static_cast<double>(k + 1) / static_cast<double>(step_size);
    if (staircase) interval = std::floor(interval);
    return min_lr.at(g) * (1.0 + rate * interval);
  };
  return s;
}

}  // namespace

LrSchedule make_lr_schedule(const SchedulerConfig& config, size_t num_groups,
                            const std::string& source) {
  const json& params = config.params.is_null() ? json::object() : config.params;
  detail::ScheduleParams r(params, source, num_groups);
  const std::string& type = config.type;
  LrSchedule s;
  if (type == "WarmupLR" || type == "WarmupDecayLR") {
    s = warmup(r, type == "WarmupDecayLR");
  } else if (type == "WarmupCosineLR") {
    s = warmup_cosine(r);
  } else if (type == "LRRangeTest") {
    s = range_test(r);
  } else if (type == "OneCycle") {
    s = detail::one_cycle_schedule(r);
  } else {
    for (const char* torch_name :
         {"StepLR", "MultiStepLR", "ExponentialLR", "CosineAnnealingLR", "LambdaLR", "LinearLR",
          "ConstantLR", "OneCycleLR", "CyclicLR", "PolynomialLR", "ReduceLROnPlateau",
          "CosineAnnealingWarmRestarts", "SequentialLR", "ChainedScheduler",
          "MultiplicativeLR"}) {
      DS_CHECK(type != torch_name, NotSupportedError, source, ": scheduler.type \"", type,
               "\" (torch.optim.lr_scheduler) is not supported yet (supported: WarmupLR, "
               "WarmupDecayLR, WarmupCosineLR, LRRangeTest, OneCycle)");
    }
    throw ConfigError(source + ": DeepSpeed does not recognize LR scheduler \"" + type +
                      "\" (scheduler.type; known: WarmupLR, WarmupDecayLR, WarmupCosineLR, "
                      "LRRangeTest, OneCycle)");
  }
  r.finish(type);
  return s;
}

void check_scheduler_supported(const SchedulerConfig& config, const std::string& source) {
  (void)make_lr_schedule(config, 0, source);
}

LrFunction make_lr_function(const SchedulerConfig& config, const std::string& source) {
  LrSchedule s = make_lr_schedule(config, 1, source);
  if (s.betas) {
    log::warn_rank0(source + ": scheduler " + config.type +
                    " cycles momentum, which this lr-only path does not apply; build it with "
                    "make_lr_scheduler");
  }
  return [lr = s.lr](int64_t k, double base) { return lr(k, 0, base); };
}

LRScheduler::LRScheduler(LrSchedule schedule, std::vector<double> base_lrs, LrSetter set_lr,
                         BetasSetter set_betas)
    : schedule_(std::move(schedule)),
      base_lrs_(std::move(base_lrs)),
      set_lr_(std::move(set_lr)),
      set_betas_(std::move(set_betas)) {
  DS_INTERNAL_ASSERT(schedule_.lr != nullptr, "an LrSchedule needs an lr function");
  apply();  // k = -1: the values DeepSpeed writes at construction
}

LRScheduler::LRScheduler(LrFunction fn, std::vector<double> base_lrs, LrSetter set_lr)
    : LRScheduler(LrSchedule{[fn = std::move(fn)](int64_t k, size_t, double base) {
                               return fn(k, base);
                             },
                             nullptr},
                  std::move(base_lrs), std::move(set_lr)) {}

void LRScheduler::step() {
  ++last_batch_iteration_;
  apply();
}

void LRScheduler::apply() {
  last_lrs_.resize(base_lrs_.size());
  for (size_t g = 0; g < base_lrs_.size(); ++g) {
    last_lrs_[g] = schedule_.lr(last_batch_iteration_, g, base_lrs_[g]);
    set_lr_(g, last_lrs_[g]);
  }
  if (!cycles_momentum()) return;
  last_betas_.resize(base_lrs_.size());
  for (size_t g = 0; g < base_lrs_.size(); ++g) {
    last_betas_[g] = schedule_.betas(last_batch_iteration_, g);
    set_betas_(g, last_betas_[g].first, last_betas_[g].second);
  }
}

json LRScheduler::state_dict() const { return {{"last_batch_iteration", last_batch_iteration_}}; }

void LRScheduler::load_state_dict(const json& state) {
  DS_CHECK(state.contains("last_batch_iteration") &&
               state["last_batch_iteration"].is_number_integer(),
           CheckpointError, "lr_scheduler state has no integer 'last_batch_iteration': ",
           state.dump());
  last_batch_iteration_ = state["last_batch_iteration"].get<int64_t>();
  apply();
}

}  // namespace deepspeed::optim
