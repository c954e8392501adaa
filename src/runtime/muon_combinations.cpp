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
  DS_CHECK(setting.model_parallel_size <= 1, NotSupportedError, head,
           "tensor parallelism (model-parallel size ", setting.model_parallel_size,
           ") is not supported yet: each rank holds a shard of a matrix, and Newton-Schulz on "
           "a shard is not the shard of Newton-Schulz on the matrix");
}

}  // namespace deepspeed::runtime
