// The engine's part of compression_training: DeepSpeed's compression scheduler, stepped after
// every applied optimizer step, and MoQ, which quantizes the fp16 weights after each step.
#include "deepspeed/compression.h"
#include "deepspeed/engine.h"
#include "runtime/tensor_parallel/engine_autotp.h"
#include "util/check.h"
#include "util/logging.h"

namespace deepspeed {

void Engine::start_compression() {
  const compression::CompressionConfig cfg = compression::compression_config(config_);
  bool any = false;
  for (const auto& [name, t] : cfg.techniques()) any = any || t->enabled;
  if (!any) return;  // layer reduction alone happened in init_compression
  const std::string& source = config_.source;
  // AutoTP's layers run their sharded forward, which knows nothing of compression.
  DS_CHECK(runtime::autotp_size(config_) <= 1, NotSupportedError, source,
           ": compression_training together with tensor_parallel.autotp_size > 1 is not "
           "supported yet");
  compression_ = std::make_unique<compression::CompressionScheduler>(*module_, cfg);
  const compression::TechniqueConfig& wq = cfg.weight_quantization;
  if (wq.enabled && !wq.quantize_weight_in_forward) {
    // Matches DeepSpeed's engine assertion.
    DS_CHECK(model_dtype_ == at::kHalf, ConfigError, source,
             ": compression_training.weight_quantization with quantize_weight_in_forward false "
             "(MoQ: the fp16 weights quantized after each optimizer step) needs fp16.enabled, as "
             "DeepSpeed's; set quantize_weight_in_forward to true to quantize in the forward");
    DS_CHECK(config_.zero_optimization.stage < 3, NotSupportedError, source,
             ": compression_training.weight_quantization's MoQ with ZeRO stage 3 (whose weights "
             "are partitioned) is not supported yet");
    for (const auto& g : wq.groups) {
      // Matches DeepSpeed's Quantizer assertions for its ternary and binary steps.
      DS_CHECK(g.target_bits > 2 || wq.rounding == "nearest", ConfigError, source,
               ": compression_training.weight_quantization.different_groups.", g.name,
               ": MoQ down to ", g.target_bits, " bits needs rounding \"nearest\"");
    }
    moq_ = std::make_unique<compression::MoqQuantizer>(*module_, wq);
  }
  log::info_rank0(std::string("compression_training: scheduler started") +
                  (moq_ ? "; MoQ quantizes the fp16 weights after each step" : ""));
}

}  // namespace deepspeed
