// See low_precision_masters.h.
#include "config/low_precision_masters.h"

#include <cctype>
#include <string>

#include "deepspeed/errors.h"

namespace deepspeed::config_detail {

// Note [Low-precision masters]
// With bf16.bf16_master_weights_and_grads (fp16.fp16_master_weights_and_grads) ZeRO keeps its
// master weights and the gradients handed to the optimizer in the model's 16-bit dtype instead
// of fp32: the masters are the model's own partitions, 2 bytes per element instead of 4 + 4.
// DeepSpeed's rules, kept here:
//  - ZeRO stages 1, 2 and 3 only;
//  - the moments stay fp32 on CPU Adam (DeepSpeedCPUAdam's fp32_optimizer_states), so the
//    optimizer must be offloaded (offload_optimizer "cpu" or "nvme") and be DeepSpeed's Adam;
//  - bf16.bf16_optimizer_states keeps the moments in bf16 too; then the optimizer may stay on
//    the device (any optimizer: its state follows the bf16 masters), and offloaded it is CPU
//    Adam with bf16 moments.
// fp16 masters have no optimizer-states twin: they always need CPU Adam.
void check_low_precision_masters(DeepSpeedConfig& c) {
  const bool bf16 = c.bf16.bf16_master_weights_and_grads;
  const bool fp16 = c.fp16.fp16_master_weights_and_grads;
  if (bf16 && !c.bf16.enabled) {
    c.warnings.push_back(c.source + ": bf16.bf16_master_weights_and_grads has no effect "
                         "without bf16.enabled");
  }
  if (fp16 && !c.fp16.enabled) {
    c.warnings.push_back(c.source + ": fp16.fp16_master_weights_and_grads has no effect "
                         "without fp16.enabled");
  }
  const bool active_bf16 = bf16 && c.bf16.enabled;
  const bool active_fp16 = fp16 && c.fp16.enabled;
  if (!active_bf16 && !active_fp16) return;
  const std::string key = active_bf16 ? "bf16.bf16_master_weights_and_grads"
                                      : "fp16.fp16_master_weights_and_grads";
  const auto& z = c.zero_optimization;
  if (z.stage < 1 || z.stage > 3) {
    throw ConfigError(c.source + ": " + key + " needs zero_optimization.stage 1, 2 or 3 (the " +
                      "16-bit masters are ZeRO partitions); stage is " + std::to_string(z.stage));
  }
  const bool offload = z.optimizer_offload() != OffloadDevice::kNone;
  const bool fp32_moments = active_fp16 || !c.bf16.bf16_optimizer_states;
  if (!offload && fp32_moments) {
    throw ConfigError(
        c.source + ": " + key + " needs zero_optimization.offload_optimizer (device \"cpu\" " +
        "or \"nvme\"): DeepSpeed's CPU Adam keeps the optimizer's moments in fp32 beside the " +
        "16-bit masters" +
        (active_bf16 ? "; or set bf16.bf16_optimizer_states: true to keep the moments in bf16 "
                       "on the device"
                     : std::string()));
  }
  if (offload && c.optimizer.present) {
    std::string type;
    for (char ch : c.optimizer.type) type += static_cast<char>(std::tolower(ch));
    const json& params = c.optimizer.params;
    const bool torch_adam = params.is_object() && params.contains("torch_adam") &&
                            params["torch_adam"].is_boolean() && params["torch_adam"].get<bool>();
    if ((type != "adam" && type != "adamw") || torch_adam) {
      throw ConfigError(c.source + ": " + key + " with offload_optimizer needs DeepSpeed's " +
                        "CPU Adam (optimizer.type \"Adam\" or \"AdamW\" without torch_adam); " +
                        "optimizer.type is \"" + c.optimizer.type + "\"" +
                        (torch_adam ? " with torch_adam" : ""));
    }
  }
}

}  // namespace deepspeed::config_detail
