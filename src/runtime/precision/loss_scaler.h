// fp16 loss scaling: the static scaler, DeepSpeed's dynamic scaler (hysteresis, window doubling,
// floor), their checkpoint state, the factory from the `fp16` config section, and the divisor that
// unscales and clips in one multiply. Overflow detection itself lives in overflow_check.h; when to
// call update_scale() (once per optimizer step, before unscaling) is the engine's business.
#pragma once

#include <cstdint>
#include <memory>

#include <nlohmann/json.hpp>

#include "deepspeed/config.h"

namespace deepspeed::runtime {

/// A constant loss scale (DeepSpeed's `LossScaler`, used for `fp16.loss_scale` > 0 and, with
/// scale 1, for bf16/fp32). Also the interface the engine holds: DynamicLossScaler overrides it.
/// Not thread-safe; one instance per engine, driven from the training thread.
class LossScaler {
 public:
  /// `scale` > 0 and finite; throws ConfigError naming fp16.loss_scale otherwise.
  explicit LossScaler(double scale = 1.0);
  virtual ~LossScaler() = default;

  /// The factor the loss is multiplied by before backward (DeepSpeed's `cur_scale`).
  double loss_scale() const { return cur_scale_; }
  /// Records one optimizer step's outcome; call once per step (accumulation boundary), whether
  /// or not `overflow` is true. A static scale never changes; only cur_iter() advances.
  virtual void update_scale(bool overflow);
  virtual bool dynamic() const { return false; }
  /// Number of update_scale() calls so far (restored by load_state_dict).
  int64_t cur_iter() const { return cur_iter_; }

  /// DeepSpeed's attribute names: {"cur_scale", "dynamic", "cur_iter"}. Dynamic scalers add the
  /// rest of their state (see DynamicLossScaler::state_dict).
  virtual nlohmann::json state_dict() const;
  /// Restores state_dict()'s fields. Throws CheckpointError when a field is missing or has the
  /// wrong type, or when the checkpoint's `dynamic` differs from this scaler's (rebuild with
  /// loss_scaler_from_state_dict() to take the checkpoint's kind, as DeepSpeed does).
  virtual void load_state_dict(const nlohmann::json& state);

 protected:
  /// Throws CheckpointError unless state["dynamic"] matches dynamic().
  void check_kind(const nlohmann::json& state) const;

  double cur_scale_;
  int64_t cur_iter_ = 0;
};

/// DeepSpeed's DynamicLossScaler constructor arguments (deepspeed/runtime/fp16/loss_scaler.py).
struct DynamicLossScalerOptions {
  double init_scale = 65536.0;   // 2^initial_scale_power
  int64_t scale_window = 1000;   // clean steps after the last overflow before the scale doubles
  double min_scale = 1.0;        // floor of the scale (fp16.min_loss_scale)
  int64_t delayed_shift = 2;     // fp16.hysteresis: overflows tolerated before the scale halves
  bool consecutive_hysteresis = false;  // any clean step refills the hysteresis budget
  /// ZeRO raises when an overflow arrives with the scale already at min_scale (after the
  /// hysteresis budget is spent); the non-ZeRO fp16 wrappers keep clamping instead.
  bool raise_error_at_min_scale = true;
};

/// Dynamic loss scaling, DeepSpeed's state machine exactly (docs/precision.md walks through it):
///   overflow: if delayed_shift == 1 or cur_hysteresis == 1: throw at the floor (when
///     raise_error_at_min_scale), else cur_scale = max(cur_scale / 2, min_scale);
///     otherwise cur_hysteresis -= 1 and the scale is kept. Either way last_overflow_iter = cur_iter.
///   clean: if consecutive_hysteresis, cur_hysteresis = delayed_shift. With
///     stable = cur_iter - last_overflow_iter - 1, when stable > 0 and stable % scale_window == 0
///     the scale doubles (and, without consecutive_hysteresis, the hysteresis budget refills).
///   then cur_iter += 1.
/// The step whose update_scale() saw overflow == true is the one the engine skips.
class DynamicLossScaler : public LossScaler {
 public:
  /// Throws ConfigError for a non-positive or non-finite init_scale/min_scale, scale_window < 1
  /// or delayed_shift < 1.
  explicit DynamicLossScaler(const DynamicLossScalerOptions& options);

  /// Throws deepspeed::Error ("Current loss scale already at minimum ...") when an overflow
  /// must lower the scale (hysteresis spent) while it already equals min_scale and
  /// raise_error_at_min_scale is set (DeepSpeed's ZeRO behaviour: the run is diverging).
  void update_scale(bool overflow) override;
  bool dynamic() const override { return true; }

  int64_t last_overflow_iter() const { return last_overflow_iter_; }
  int64_t cur_hysteresis() const { return cur_hysteresis_; }
  double scale_factor() const { return kScaleFactor; }
  const DynamicLossScalerOptions& options() const { return options_; }

  /// Adds "last_overflow_iter", "scale_factor", "scale_window", "min_scale", "delayed_shift",
  /// "cur_hysteresis", "consecutive_hysteresis", "raise_error_at_min_scale": the attributes of
  /// DeepSpeed's pickled DynamicLossScaler. Loading restores the options too: DeepSpeed replaces
  /// its scaler object with the checkpoint's, so the checkpoint's window and floor win.
  nlohmann::json state_dict() const override;
  void load_state_dict(const nlohmann::json& state) override;

 private:
  static constexpr double kScaleFactor = 2.0;  // DeepSpeed hard-codes it; not configurable
  DynamicLossScalerOptions options_;
  int64_t last_overflow_iter_ = -1;
  int64_t cur_hysteresis_;
};

/// Which DeepSpeed optimizer wrapper's scaling rules to follow (inventory §2.2 vs §2.3).
enum class LossScalerFlavor {
  /// ZeRO stages 1-3 (and DeepSpeed's CreateLossScaler): hysteresis, raise at the floor.
  kZero,
  /// Non-ZeRO FP16_Optimizer / FP16_UnfusedOptimizer: hysteresis and consecutive_hysteresis are
  /// ignored (every overflow halves), and the scale clamps at min_loss_scale without raising.
  kFp16Optimizer,
};

/// DeepSpeed's CreateLossScaler for an fp16 config: fp16 disabled -> static scale 1 (bf16/fp32
/// train unscaled); loss_scale > 0 -> static; loss_scale 0 -> dynamic from initial_scale_power,
/// loss_scale_window, hysteresis, consecutive_hysteresis and min_loss_scale. Throws ConfigError
/// naming the key for values DeepSpeed rejects that the parser lets through (fractional
/// min_loss_scale: DeepSpeed's field is an int) and for a 2^initial_scale_power beyond double.
std::unique_ptr<LossScaler> make_loss_scaler(const Fp16Config& fp16,
                                             LossScalerFlavor flavor = LossScalerFlavor::kZero);

/// Rebuilds the scaler a checkpoint holds (static or dynamic, with its own options), as
/// DeepSpeed's ZeRO load_state_dict replaces its scaler with the unpickled one.
/// Throws CheckpointError on missing or mistyped fields.
std::unique_ptr<LossScaler> loss_scaler_from_state_dict(const nlohmann::json& state);

/// The divisor that unscales and clips in one multiply (inventory §2.5): gradients are multiplied
/// by 1 / combined_scale(...). `norm_of_scaled_grads` is the global L2 norm of the still-scaled
/// gradients, `loss_scale` the scale AFTER this step's update_scale() (DeepSpeed's ordering),
/// `clip` is gradient_clipping (<= 0 disables). Returns loss_scale * max(1, (norm/loss_scale +
/// 1e-6) / clip); a NaN norm yields NaN, as DeepSpeed's torch.clamp does.
double combined_scale(double norm_of_scaled_grads, double loss_scale, double clip);

}  // namespace deepspeed::runtime
