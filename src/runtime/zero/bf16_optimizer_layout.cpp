#include "runtime/zero/bf16_optimizer_layout.h"

#include <algorithm>

#include <ATen/ATen.h>

namespace deepspeed::runtime {

bool zero1_uses_bf16_optimizer(const DeepSpeedConfig& config) {
  const auto& z = config.zero_optimization;
  return config.bf16.enabled && z.stage == 1 && config.data_types.grad_accum_dtype == "fp32" &&
         z.optimizer_offload() == OffloadDevice::kNone;
}

void drop_bf16_optimizer_padding(std::vector<at::Tensor>* partitions,
                                 const std::vector<int64_t>& group_paddings) {
  for (size_t g = 0; g < partitions->size() && g < group_paddings.size(); ++g) {
    at::Tensor& t = (*partitions)[g];
    t = t.narrow(0, 0, std::max<int64_t>(t.numel() - group_paddings[g], 0));
  }
}

}  // namespace deepspeed::runtime
