// Static and dynamic loss scalers. Matches DeepSpeed's deepspeed/runtime/fp16/loss_scaler.py
// (DynamicLossScaler.update_scale) step for step; the non-ZeRO wrappers' variant is the same
// machine with delayed_shift 1 and no raise at the floor (see make_loss_scaler).
#include "runtime/precision/loss_scaler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "util/check.h"
#include "util/logging.h"

namespace deepspeed::runtime {
namespace {

using nlohmann::json;

// DeepSpeed logs int(scale); keep integers integral and show fractions (a floor below 1) as is.
std::string show_scale(double s) {
  char buf[64];
  if (std::isfinite(s) && std::floor(s) == s && std::fabs(s) < 9.0e18) {
    std::snprintf(buf, sizeof(buf), "%lld", static_cast<long long>(s));
  } else {
    std::snprintf(buf, sizeof(buf), "%g", s);
  }
  return buf;
}

const json& field(const json& state, const char* name) {
  DS_CHECK(state.is_object(), CheckpointError,
           "loss scaler state: expected a JSON object, found ", state.dump());
  auto it = state.find(name);
  DS_CHECK(it != state.end(), CheckpointError, "loss scaler state: field '", name,
           "' is missing (fields present: ", state.dump(), ")");
  return *it;
}

double number_field(const json& state, const char* name) {
  const json& v = field(state, name);
  DS_CHECK(v.is_number(), CheckpointError, "loss scaler state: '", name, "' is ", v.dump(),
           "; expected a number");
  return v.get<double>();
}

int64_t int_field(const json& state, const char* name) {
  const json& v = field(state, name);
  DS_CHECK(v.is_number_integer(), CheckpointError, "loss scaler state: '", name, "' is ",
           v.dump(), "; expected an integer");
  return v.get<int64_t>();
}

bool bool_field(const json& state, const char* name) {
  const json& v = field(state, name);
  DS_CHECK(v.is_boolean(), CheckpointError, "loss scaler state: '", name, "' is ", v.dump(),
           "; expected true or false");
  return v.get<bool>();
}

void check_options(const DynamicLossScalerOptions& o) {
  DS_CHECK(std::isfinite(o.init_scale) && o.init_scale > 0, ConfigError,
           "fp16 dynamic loss scale: initial scale (2^initial_scale_power) is ",
           show_scale(o.init_scale), "; expected a finite number > 0");
  DS_CHECK(o.scale_window >= 1, ConfigError, "fp16.loss_scale_window is ", o.scale_window,
           "; must be > 0 when dynamic loss scaling is enabled (loss_scale=0)");
  DS_CHECK(std::isfinite(o.min_scale) && o.min_scale > 0, ConfigError,
           "fp16.min_loss_scale is ", show_scale(o.min_scale),
           "; must be > 0 when dynamic loss scaling is enabled (loss_scale=0)");
  DS_CHECK(o.delayed_shift >= 1, ConfigError, "fp16.hysteresis is ", o.delayed_shift,
           "; expected an integer >= 1");
}

}  // namespace

LossScaler::LossScaler(double scale) : cur_scale_(scale) {
  DS_CHECK(std::isfinite(scale) && scale > 0, ConfigError, "fp16.loss_scale is ",
           show_scale(scale), "; a static loss scale must be a finite number > 0 (0 = dynamic)");
}

void LossScaler::update_scale(bool /*overflow*/) { cur_iter_ += 1; }

json LossScaler::state_dict() const {
  return {{"cur_scale", cur_scale_}, {"dynamic", dynamic()}, {"cur_iter", cur_iter_}};
}

void LossScaler::load_state_dict(const json& state) {
  check_kind(state);
  const double scale = number_field(state, "cur_scale");
  DS_CHECK(std::isfinite(scale) && scale > 0, CheckpointError,
           "loss scaler state: 'cur_scale' is ", show_scale(scale), "; expected a number > 0");
  // DeepSpeed's pickled static LossScaler has no cur_iter; a missing one restarts the count.
  const int64_t iter = state.contains("cur_iter") ? int_field(state, "cur_iter") : 0;
  cur_scale_ = scale;
  cur_iter_ = iter;
}

void LossScaler::check_kind(const json& state) const {
  const bool ckpt_dynamic = bool_field(state, "dynamic");
  DS_CHECK(ckpt_dynamic == dynamic(), CheckpointError, "loss scaler state: the checkpoint holds a ",
           ckpt_dynamic ? "dynamic" : "static", " loss scaler, this one is ",
           dynamic() ? "dynamic" : "static",
           "; rebuild it with loss_scaler_from_state_dict() to adopt the checkpoint's");
}

DynamicLossScaler::DynamicLossScaler(const DynamicLossScalerOptions& options)
    : LossScaler((check_options(options), options.init_scale)),
      options_(options),
      cur_hysteresis_(options.delayed_shift) {}

void DynamicLossScaler::update_scale(bool overflow) {
  if (overflow) {
    if (options_.delayed_shift == 1 || cur_hysteresis_ == 1) {
      // Exact equality, as DeepSpeed: a scale restored below the floor is lifted to it instead.
      DS_CHECK(!(cur_scale_ == options_.min_scale && options_.raise_error_at_min_scale), Error,
               "Current loss scale already at minimum - cannot decrease scale anymore. Exiting "
               "run. (fp16 loss scale ", show_scale(cur_scale_), " == fp16.min_loss_scale at "
               "iteration ", cur_iter_, " and the gradients overflowed again; the run is "
               "diverging: lower the learning rate or find the inf/nan source)");
      const double next = std::max(cur_scale_ / kScaleFactor, options_.min_scale);
      log::info_rank0("OVERFLOW! Rank 0 Skipping step. Attempted loss scale: " +
                      show_scale(cur_scale_) + ", reducing to " + show_scale(next));
      cur_scale_ = next;
    } else {
      log::info_rank0("OVERFLOW! Rank 0 Skipping step. Attempted loss scale: " +
                      show_scale(cur_scale_) + ", but hysteresis is " +
                      std::to_string(cur_hysteresis_) + ". Reducing hysteresis to " +
                      std::to_string(cur_hysteresis_ - 1));
      cur_hysteresis_ -= 1;
    }
    last_overflow_iter_ = cur_iter_;
  } else {
    if (options_.consecutive_hysteresis) cur_hysteresis_ = options_.delayed_shift;
    // The step right after an overflow has stable == 0, so a doubling needs scale_window clean
    // steps counted from the one after that: window + 1 clean steps in all (inventory §2.2).
    const int64_t stable = cur_iter_ - last_overflow_iter_ - 1;
    if (stable > 0 && stable % options_.scale_window == 0) {
      if (!options_.consecutive_hysteresis) cur_hysteresis_ = options_.delayed_shift;
      cur_scale_ *= kScaleFactor;
    }
  }
  cur_iter_ += 1;
}

json DynamicLossScaler::state_dict() const {
  json j = LossScaler::state_dict();
  j["last_overflow_iter"] = last_overflow_iter_;
  j["scale_factor"] = kScaleFactor;
  j["scale_window"] = options_.scale_window;
  j["min_scale"] = options_.min_scale;
  j["delayed_shift"] = options_.delayed_shift;
  j["cur_hysteresis"] = cur_hysteresis_;
  j["consecutive_hysteresis"] = options_.consecutive_hysteresis;
  j["raise_error_at_min_scale"] = options_.raise_error_at_min_scale;
  return j;
}

void DynamicLossScaler::load_state_dict(const json& state) {
  check_kind(state);
  // Everything is read and checked before anything is assigned: a failed load changes nothing.
  DynamicLossScalerOptions o = options_;
  o.scale_window = int_field(state, "scale_window");
  o.min_scale = number_field(state, "min_scale");
  o.delayed_shift = int_field(state, "delayed_shift");
  o.consecutive_hysteresis = bool_field(state, "consecutive_hysteresis");
  // Older DeepSpeed scalers predate the flag; they always raised.
  o.raise_error_at_min_scale = state.contains("raise_error_at_min_scale")
                                   ? bool_field(state, "raise_error_at_min_scale")
                                   : true;
  const double factor = number_field(state, "scale_factor");
  DS_CHECK(factor == kScaleFactor, CheckpointError, "loss scaler state: 'scale_factor' is ",
           show_scale(factor), "; DeepSpeed's dynamic scaler always uses 2");
  try {
    check_options(o);
  } catch (const ConfigError& e) {
    throw CheckpointError(std::string("loss scaler state: ") + e.what());
  }
  const int64_t last_overflow = int_field(state, "last_overflow_iter");
  const int64_t hysteresis = int_field(state, "cur_hysteresis");
  LossScaler::load_state_dict(state);  // cur_scale and cur_iter; nothing assigned if it throws
  options_ = o;
  last_overflow_iter_ = last_overflow;
  cur_hysteresis_ = hysteresis;
}

std::unique_ptr<LossScaler> make_loss_scaler(const Fp16Config& fp16, LossScalerFlavor flavor) {
  // Matches DeepSpeed's CreateLossScaler: other dtypes get a scaler that does nothing.
  if (!fp16.enabled) return std::make_unique<LossScaler>(1.0);
  // DeepSpeed's field is an int, so pydantic rejects 0.5 while the parser keeps a double.
  DS_CHECK(std::floor(fp16.min_loss_scale) == fp16.min_loss_scale, ConfigError,
           "fp16.min_loss_scale is ", fp16.min_loss_scale, "; expected an integer");
  if (fp16.loss_scale > 0) return std::make_unique<LossScaler>(fp16.loss_scale);
  DS_CHECK(fp16.initial_scale_power >= 0 && fp16.initial_scale_power <= 1023, ConfigError,
           "fp16.initial_scale_power is ", fp16.initial_scale_power,
           "; expected 0..1023 (2^power must be a finite double)");
  DynamicLossScalerOptions o;
  o.init_scale = std::ldexp(1.0, static_cast<int>(fp16.initial_scale_power));
  o.scale_window = fp16.loss_scale_window;
  o.min_scale = fp16.min_loss_scale;
  o.delayed_shift = fp16.hysteresis;
  o.consecutive_hysteresis = fp16.consecutive_hysteresis;
  if (flavor == LossScalerFlavor::kFp16Optimizer) {
    // FP16_Optimizer._update_scale halves on every overflow and clamps at the floor: the same
    // machine with a hysteresis of 1 and no raise.
    o.delayed_shift = 1;
    o.consecutive_hysteresis = false;
    o.raise_error_at_min_scale = false;
  }
  return std::make_unique<DynamicLossScaler>(o);
}

std::unique_ptr<LossScaler> loss_scaler_from_state_dict(const json& state) {
  std::unique_ptr<LossScaler> s;
  if (bool_field(state, "dynamic")) {
    DynamicLossScalerOptions o;
    o.init_scale = number_field(state, "cur_scale");
    try {
      s = std::make_unique<DynamicLossScaler>(o);
    } catch (const ConfigError& e) {
      throw CheckpointError(std::string("loss scaler state: ") + e.what());
    }
  } else {
    const double scale = number_field(state, "cur_scale");
    DS_CHECK(std::isfinite(scale) && scale > 0, CheckpointError,
             "loss scaler state: 'cur_scale' is ", show_scale(scale), "; expected a number > 0");
    s = std::make_unique<LossScaler>(scale);
  }
  s->load_state_dict(state);
  return s;
}

double combined_scale(double norm_of_scaled_grads, double loss_scale, double clip) {
  if (!(clip > 0.0)) return loss_scale;
  const double c = (norm_of_scaled_grads / loss_scale + 1e-6) / clip;
  if (std::isnan(c)) return c;  // torch.clamp(nan, min=1) stays nan
  return (c > 1.0 ? c : 1.0) * loss_scale;
}

}  // namespace deepspeed::runtime
