// What this build implements. Each DeepSpeed feature that is configured but not implemented yet
// is refused here by its key path, so nothing the user asked for is silently ignored.
// Keep docs/config.md's "status" column in sync with this file. It reads the typed fields only
// (never `raw`), so a value of the wrong type cannot reach it.
#include "config/feature_sections.h"
#include "deepspeed/config.h"
#include "util/check.h"

namespace deepspeed::config_detail {
namespace {

[[noreturn]] void refuse(const DeepSpeedConfig& c, const std::string& what) {
  throw NotSupportedError(c.source + ": " + what + " is not supported yet");
}

}  // namespace

void check_features_supported(const DeepSpeedConfig& c) {
  const auto& z = c.zero_optimization;
  const auto& fp16 = c.fp16;
  const auto& bf16 = c.bf16;
  const auto& source = c.source;
  // Matches DeepSpeed, whose stage 3 raises NotImplementedError when it saves.
  if (z.elastic_checkpoint && z.stage == 3) {
    refuse(c, "zero_optimization.elastic_checkpoint with ZeRO stage 3");
  }
  if (z.zenflow) refuse(c, "zero_optimization.zenflow (ZenFlow)");
  // Matches the ZeRO-3 engine's own check (stage3.cpp), so that ds_config refuses it too.
  if (z.stage == 3 && z.stage3_module_granularity_threshold != 0) {
    throw NotSupportedError(
        source + ": zero_optimization.stage3_module_granularity_threshold " +
        std::to_string(z.stage3_module_granularity_threshold) +
        " is not supported: units are the model's zero::Unit modules and Sequential children, "
        "each already gathered with all its descendants (see docs/zero.md); use 0");
  }
  // The NVMe swapper's aio handle refuses use_gds too; with no NVMe offload aio is unused
  // (feature_sections.cpp warns).
  const bool nvme = z.stage == 3 && (z.optimizer_offload() == OffloadDevice::kNvme ||
                                     z.param_offload() == OffloadDevice::kNvme);
  if (nvme && c.aio.use_gds) {
    throw NotSupportedError(source + ": aio.use_gds (GPUDirect Storage) is not supported: it "
                            "needs CUDA and cuFile, which this build has neither of; set it to "
                            "false");
  }
  if (z.optimizer_offload() != OffloadDevice::kNone) {
    // docs/offload.md: device "cpu" with ZeRO 1/2; nvme (DeepSpeed: stage 3 only) comes with
    // stage 3's sub-groups (the swapper is runtime/swap).
    const auto& o = *z.offload_optimizer;
    const std::string key = "zero_optimization.offload_optimizer";
    if (z.stage == 0) {
      throw ConfigError(source + ": " + key + " needs zero_optimization.stage 1, 2 or 3 "
                        "(the offloaded optimizer steps a ZeRO partition); stage is 0");
    }
    // device "nvme" with stages 1/2 is DeepSpeed's host-memory offload (ds_config.cpp warns).
    if (o.ratio < 1.0 && z.stage < 3) {
      refuse(c, key + ".ratio < 1 with ZeRO stage " + std::to_string(z.stage) +
                        " (partial offload, DeepSpeed's Twin-Flow, works with stage 3 only)");
    }
    if (o.super_offload) refuse(c, key + ".super_offload");
  }
  if (z.stage == 3 && z.zero_hpz_partition_size > 1) {
    if (z.mics_shard_size > 0) {
      refuse(c, "zero_optimization.zero_hpz_partition_size together with mics_shard_size");
    }
    if (z.param_offload() != OffloadDevice::kNone) {
      refuse(c, "zero_optimization.zero_hpz_partition_size with offload_param");
    }
    if (c.sequence_parallel_size > 1) {
      refuse(c, "zero_optimization.zero_hpz_partition_size with sequence_parallel_size > 1");
    }
  }
  if (z.stage == 3 && z.mics_shard_size > 0) {
    // Matches DeepSpeed's MiCS_Optimizer ("Local sharding has no support for CPU offloading").
    if (z.optimizer_offload() != OffloadDevice::kNone ||
        z.param_offload() != OffloadDevice::kNone) {
      refuse(c, "zero_optimization.mics_shard_size with offload_optimizer or offload_param");
    }
    if (c.sequence_parallel_size > 1) {
      refuse(c, "zero_optimization.mics_shard_size with sequence_parallel_size > 1");
    }
  }
  // DeepSpeed's fp16 wrapper reduces sparse rows too, its BF16_Optimizer does not: neither is
  // reproduced for our flat 16-bit stage 0 (fp32 stage 0 reduces rows; ZeRO 1-3 ignore the key).
  if (c.sparse_gradients && z.stage == 0 && (fp16.enabled || bf16.enabled)) {
    refuse(c, std::string("sparse_gradients with ") + (fp16.enabled ? "fp16" : "bf16") +
                  " and zero_optimization.stage 0");
  }
  if (c.wandb.enabled) refuse(c, "wandb.enabled");
  if (c.comet_enabled) refuse(c, "comet.enabled");

  // torch_autocast trains fp32 weights under autocast: a model already cast to 16 bits by
  // fp16/bf16 has nothing left for it to do but a second loss scaler to disagree with.
  if (c.torch_autocast.enabled && (fp16.enabled || bf16.enabled)) {
    refuse(c, std::string("torch_autocast.enabled together with ") +
                  (fp16.enabled ? "fp16" : "bf16") + ".enabled");
  }
  if (!c.unimplemented_requests.empty()) refuse(c, c.unimplemented_requests.front());
  // Matches DeepSpeed: without ZeRO a 16-bit gradient accumulation needs a 16-bit model.
  const auto& data_types = c.data_types;
  if (!data_types.grad_accum_dtype.empty() && data_types.grad_accum_dtype != "fp32" &&
      z.stage == 0 && !fp16.enabled && !bf16.enabled) {
    refuse(c, "data_types.grad_accum_dtype " + data_types.grad_accum_dtype +
                      " with an fp32 model and zero_optimization.stage 0");
  }
  if (!data_types.buffer_dtype.empty() && data_types.buffer_dtype != "fp32") {
    refuse(c, "data_types.buffer_dtype " + data_types.buffer_dtype);
  }
}

}  // namespace deepspeed::config_detail
