// See zero_checkpoint.h.
#include "runtime/zero/zero_checkpoint.h"

namespace deepspeed::runtime {

nlohmann::json loss_scaler_json(const checkpoint::LossScalerState& s) {
  nlohmann::json j = {{"cur_scale", s.cur_scale}, {"dynamic", s.dynamic}, {"cur_iter", s.cur_iter}};
  if (!s.dynamic) return j;
  j["last_overflow_iter"] = s.last_overflow_iter;
  j["scale_factor"] = s.scale_factor;
  j["scale_window"] = s.scale_window;
  j["min_scale"] = s.min_scale;
  j["delayed_shift"] = s.delayed_shift;
  j["cur_hysteresis"] = s.cur_hysteresis;
  j["consecutive_hysteresis"] = s.consecutive_hysteresis;
  j["raise_error_at_min_scale"] = s.raise_error_at_min_scale;
  return j;
}

}  // namespace deepspeed::runtime
