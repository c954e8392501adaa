// DeepSpeed's OneCycle schedule (reference §4): lr rises from cycle_min_lr to cycle_max_lr over
// cycle_first_step_size iterations and falls back over cycle_second_step_size, optionally in
// stairs; momentum (beta1) moves the opposite way; after the cycle both may decay.
#include <cmath>
#include <utility>

#include "runtime/optim/schedule_params.h"
#include "util/check.h"

namespace deepspeed::optim::detail {
namespace {

// DeepSpeed forces beta2 to this value whenever OneCycle writes betas.
constexpr double kOneCycleBeta2 = 0.99;

struct Cycle {
  double first;          // cycle_first_step_size
  double second;         // cycle_second_step_size
  double first_stairs;   // cycle_first_stair_count
  double second_stairs;  // cycle_second_stair_count

  // Position in [0, 1] within the cycle at k: 0 at min lr (max momentum), 1 at the peak.
  double scale(int64_t k) const {
    const double total = first + second;
    const double ratio = first / total;
    const double b = static_cast<double>(k + 1);
    const double cycle = std::floor(1.0 + b / total);
    const double x = 1.0 + b / total - cycle;
    double s;
    double stairs;
    if (x <= ratio) {
      s = x / ratio;
      stairs = first_stairs;
    } else {
      s = (x - 1.0) / (ratio - 1.0);
      stairs = second_stairs;
    }
    if (stairs > 0) {
      const double ci = std::fmod(b, total);
      const double pos = ci <= first ? ci * stairs / first : (total - ci) * stairs / second;
      s = std::floor(pos) / stairs;
    }
    return s;
  }
};

}  // namespace

LrSchedule one_cycle_schedule(ScheduleParams& r) {
  std::optional<PerGroup> min_lr = r.opt_per_group("cycle_min_lr");
  std::optional<PerGroup> max_lr = r.opt_per_group("cycle_max_lr");
  DS_CHECK(min_lr.has_value(), ConfigError, r.where("cycle_min_lr"), " is required by OneCycle");
  DS_CHECK(max_lr.has_value(), ConfigError, r.where("cycle_max_lr"), " is required by OneCycle");
  const double decay_lr_rate = r.number("decay_lr_rate", 0.0);
  Cycle c;
  c.first = r.number("cycle_first_step_size", 2000);
  DS_CHECK(c.first > 0, ConfigError, r.where("cycle_first_step_size"), " is ", c.first,
           "; expected a positive number");
  c.second = r.number("cycle_second_step_size", c.first);
  DS_CHECK(c.second >= 0, ConfigError, r.where("cycle_second_step_size"), " is ", c.second,
           "; expected a non-negative number");
  c.first_stairs = r.number("cycle_first_stair_count", 0);
  c.second_stairs = r.number("cycle_second_stair_count", c.first_stairs);
  const double decay_step_size = r.number("decay_step_size", 0);
  const bool cycle_momentum = r.boolean("cycle_momentum", true);
  const PerGroup min_mom = r.per_group("cycle_min_mom", 0.8);
  const PerGroup max_mom = r.per_group("cycle_max_mom", 0.9);
  const double decay_mom_rate = r.number("decay_mom_rate", 0.0);
  const double total = c.first + c.second;
  // Matches DeepSpeed: no decay after the cycle unless both the step size and the rate are set.
  const bool decay_lr = decay_step_size != 0 && decay_lr_rate != 0;
  const bool decay_mom = decay_step_size != 0 && decay_mom_rate != 0;

  LrSchedule s;
  s.lr = [=, min_lr = *min_lr, max_lr = *max_lr](int64_t k, size_t g, double) {
    if (static_cast<double>(k) < total) {
      return min_lr.at(g) + (max_lr.at(g) - min_lr.at(g)) * c.scale(k);
    }
    if (!decay_lr) return min_lr.at(g);
    const double d = static_cast<double>(k) - total + 1.0;
    return min_lr.at(g) / (1.0 + decay_lr_rate * d / decay_step_size);
  };
  if (!cycle_momentum) return s;
  s.betas = [=](int64_t k, size_t g) {
    // Construction writes (cycle_min_mom, 0.99); the formula would give cycle_max_mom there.
    if (k < 0) return std::make_pair(min_mom.at(g), kOneCycleBeta2);
    if (static_cast<double>(k) < total) {
      return std::make_pair(max_mom.at(g) - (max_mom.at(g) - min_mom.at(g)) * c.scale(k),
                            kOneCycleBeta2);
    }
    if (!decay_mom) return std::make_pair(max_mom.at(g), kOneCycleBeta2);
    const double d = static_cast<double>(k) - total + 1.0;
    return std::make_pair(max_mom.at(g) * (1.0 + decay_mom_rate * d / decay_step_size),
                          kOneCycleBeta2);
  };
  return s;
}

}  // namespace deepspeed::optim::detail
