#include "runtime/muon_combinations.h"

#include <string>

#include "deepspeed/muon.h"
#include "util/check.h"

namespace deepspeed::runtime {

void check_muon_combinations(const torch::optim::Optimizer& optimizer,
                             const DeepSpeedConfig& config, const MuonSetting& setting) {
  if (dynamic_cast<const optim::Muon*>(&optimizer) == nullptr) return;
  const auto& z = config.zero_optimization;
  const std::string head = config.source + ": the Muon optimizer with ";
  DS_CHECK(z.stage != 3 || z.optimizer_offload() != OffloadDevice::kNvme, NotSupportedError,
           head, "zero_optimization.offload_optimizer.device \"nvme\" at stage 3 is not "
           "supported yet (the momentum is swapped out when the orthogonalization needs it); "
           "\"cpu\" is");
  DS_CHECK(!setting.pipeline, NotSupportedError, head,
           "pipeline parallelism is not supported yet");
  DS_CHECK(setting.model_parallel_size <= 1, NotSupportedError, head,
           "tensor parallelism (model-parallel size ", setting.model_parallel_size,
           ") is not supported yet: each rank holds a shard of a matrix, and Newton-Schulz on "
           "a shard is not the shard of Newton-Schulz on the matrix");
  DS_CHECK(!setting.experts, NotSupportedError, head,
           "MoE expert parameters is not supported yet (DeepSpeed orthogonalizes each expert's "
           "matrix of a grouped tensor apart)");
  DS_CHECK(config.sequence_parallel_size <= 1, NotSupportedError, head,
           "sequence_parallel_size ", config.sequence_parallel_size, " is not supported yet");
}

}  // namespace deepspeed::runtime
