// What this build implements. Each DeepSpeed feature that is configured but not implemented yet
// is refused here by its key path, so nothing the user asked for is silently ignored.
// Keep docs/config.md's "status" column in sync with this file.
#include <algorithm>
#include <cctype>

#include "deepspeed/config.h"
#include "runtime/optim/optimizer_factory.h"
#include "deepspeed/lr_schedules.h"
#include "util/check.h"

namespace deepspeed {
namespace {

[[noreturn]] void refuse(const DeepSpeedConfig& c, const std::string& what) {
  throw NotSupportedError(c.source + ": " + what + " is not supported yet");
}

bool enabled_flag(const json& raw, const char* section) {
  auto it = raw.find(section);
  if (it == raw.end() || !it->is_object()) return false;
  auto e = it->find("enabled");
  return e != it->end() && e->is_boolean() && e->get<bool>();
}

}  // namespace

void DeepSpeedConfig::check_supported() const {
  const auto& z = zero_optimization;
  if (z.elastic_checkpoint) refuse(*this, "zero_optimization.elastic_checkpoint");
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
      refuse(*this, key + ".ratio < 1 with ZeRO stage " + std::to_string(z.stage) +
                        " (partial offload, DeepSpeed's Twin-Flow, works with stage 3 only)");
    }
    if (o.super_offload) refuse(*this, key + ".super_offload");
  }
  if (z.zero_quantized_weights || z.zero_quantized_gradients || z.zero_hpz_partition_size > 1) {
    refuse(*this, "ZeRO++ (zero_optimization.zero_quantized_* / zero_hpz_partition_size)");
  }
  if (z.mics_shard_size > 0) refuse(*this, "zero_optimization.mics_shard_size (MiCS)");
  if (fp16.enabled && fp16.fp16_master_weights_and_grads) {
    refuse(*this, "fp16.fp16_master_weights_and_grads");
  }
  if (bf16.enabled && bf16.bf16_master_weights_and_grads) {
    refuse(*this, "bf16.bf16_master_weights_and_grads");
  }
  if (bf16.enabled && bf16.immediate_grad_update) refuse(*this, "bf16.immediate_grad_update");
  if (sparse_gradients) refuse(*this, "sparse_gradients");
  if (wandb.enabled) refuse(*this, "wandb.enabled");
  if (enabled_flag(raw, "comet")) refuse(*this, "comet.enabled");
  if (checkpoint.load_universal) refuse(*this, "checkpoint.load_universal");

  if (elasticity.enabled) refuse(*this, "elasticity.enabled");
  if (progressive_layer_drop.enabled) refuse(*this, "progressive_layer_drop.enabled");
  if (torch_autocast.enabled) refuse(*this, "torch_autocast.enabled");
  if (activation_checkpointing.partition_activations || activation_checkpointing.cpu_checkpointing ||
      activation_checkpointing.contiguous_memory_optimization) {
    refuse(*this, "activation_checkpointing (partition_activations / cpu_checkpointing / "
                  "contiguous_memory_optimization)");
  }
  for (const char* section :
       {"amp", "curriculum_learning", "data_efficiency", "autotuning", "hybrid_engine", "nebula",
        "datastates", "eigenvalue", "quantize_training"}) {
    if (enabled_flag(raw, section)) refuse(*this, std::string(section) + ".enabled");
  }
  if (raw.contains("sparse_attention")) refuse(*this, "sparse_attention");
  if (raw.contains("compression_training")) refuse(*this, "compression_training");
  if (auto it = raw.find("compile"); it != raw.end() && it->is_object() &&
                                     it->value("deepcompile", false)) {
    refuse(*this, "compile.deepcompile");
  }
  if (auto it = raw.find("tensor_parallel"); it != raw.end() && it->is_object() &&
                                             it->value("autotp_size", 0) > 1) {
    refuse(*this, "tensor_parallel.autotp_size > 1");
  }
  if (raw.value("graph_harvesting", false)) refuse(*this, "graph_harvesting");
  if (auto it = raw.find("sequence_parallel_size");
      it != raw.end() && it->is_number_integer() && it->get<int64_t>() > 1) {
    refuse(*this, "sequence_parallel_size > 1");
  }
  // Matches DeepSpeed: without ZeRO a 16-bit gradient accumulation needs a 16-bit model.
  if (!data_types.grad_accum_dtype.empty() && data_types.grad_accum_dtype != "fp32" &&
      z.stage == 0 && !fp16.enabled && !bf16.enabled) {
    refuse(*this, "data_types.grad_accum_dtype " + data_types.grad_accum_dtype +
                      " with an fp32 model and zero_optimization.stage 0");
  }
  if (!data_types.buffer_dtype.empty() && data_types.buffer_dtype != "fp32") {
    refuse(*this, "data_types.buffer_dtype " + data_types.buffer_dtype);
  }

  if (optimizer.present) optim::check_optimizer_supported(optimizer, source);
  if (scheduler.present) optim::check_scheduler_supported(scheduler, source);
}

}  // namespace deepspeed
