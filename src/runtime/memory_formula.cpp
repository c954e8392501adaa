// The memory formula: see memory_formula.h. Padding (flat buffers rounded to a multiple of W) is
// left out: at most W-1 elements per parameter group.
#include "runtime/memory_formula.h"

#include <algorithm>
#include <cctype>
#include <cstdio>

namespace deepspeed {
namespace {

int64_t div_up(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

ModelStateBytes estimate_model_state_bytes(const ModelStateInputs& in) {
  ModelStateBytes m;
  const int64_t psi = in.num_params;
  const int64_t w = std::max<int64_t>(1, in.dp_world_size);
  const int64_t b = in.param_bytes;
  const int64_t k = in.optimizer_state_bytes_per_param;
  const int64_t shard = in.stage == 0 ? psi : div_up(psi, w);  // elements this rank updates
  const bool mixed = b < 4;
  // fp16/bf16: the gradient partitions accumulate in fp32 (data_types.grad_accum_dtype).
  const int64_t grad_bytes = mixed ? 4 : b;
  // ZeRO 1-3: one buffer pool per communication dtype, each as large as its largest bucket
  // (torch_autocast sends its low-precision modules' gradients in their own dtype); at stage 3
  // with reduce_scatter each send buffer has a receive buffer of 1/W beside it.
  const int64_t bucket_size = std::max<int64_t>(in.reduce_bucket_size, 1);
  const int64_t low = std::clamp<int64_t>(in.low_precision_numel, 0, psi);
  const auto pool = [&](int64_t numel, int64_t bytes_per, int64_t receive_divisor) -> int64_t {
    const int64_t size = std::min(bucket_size, std::max<int64_t>(numel, 1));
    return bytes_per * (size + (receive_divisor > 0 ? div_up(size, receive_divisor) : 0));
  };
  const auto pools = [&](int64_t receive_divisor) -> int64_t {
    if (low == 0) return pool(psi, b, receive_divisor);
    return (psi > low ? pool(psi - low, b, receive_divisor) : 0) +
           pool(low, in.low_precision_bytes, receive_divisor);
  };
  m.optimizer_states = k * shard;
  m.master_params = !mixed                    ? 0
                    : !in.low_precision_masters ? 4 * shard
                    : in.offload_optimizer && !in.on_cpu ? b * shard
                                                         : 0;
  switch (in.stage) {
    case 0:
      m.params = b * psi;
      m.grads = b * psi;
      m.reduction_buffers = w > 1 ? b * psi : 0;  // the buckets cover every gradient
      m.aliased = m.reduction_buffers;            // param.grad is a view of its bucket
      break;
    case 1:
    case 2:
      m.params = b * psi;
      m.grads = grad_bytes * shard;
      m.reduction_buffers = w > 1 ? pools(0) * (in.overlap_comm ? 2 : 1) : 0;
      if (in.stage == 1) m.transient = b * psi;  // param.grad until the boundary
      break;
    default:
      m.params = b * shard;
      m.grads = grad_bytes * shard;
      m.reduction_buffers = pools(in.reduce_scatter ? w : 0) * (in.overlap_comm ? 2 : 1);
      // A unit's parameters gathered in full, and the next one prefetched.
      m.transient = 2 * b * in.largest_param_numel;
      // hpZ's secondary partitions, from the forward to the step.
      if (in.hpz_partition_size > 1) m.transient += b * div_up(psi, in.hpz_partition_size);
      break;
  }
  if (in.offload_optimizer) m.offloaded_optimizer = m.optimizer_states + m.master_params;
  if (in.offload_param && in.stage == 3) m.offloaded_params = m.params;
  return m;
}

ModelStateInputs model_state_inputs(const DeepSpeedConfig& c, int64_t num_params,
                                    int64_t largest_param_numel, bool on_cpu) {
  ModelStateInputs in;
  in.num_params = num_params;
  // ZeRO partitions over data x sequence ranks (sequence parallelism's reduction group).
  in.dp_world_size = c.batch.dp_world_size * c.sequence_parallel_size;
  in.stage = c.zero_optimization.stage;
  // MiCS partitions over its shard groups.
  if (in.stage == 3 && c.zero_optimization.mics_shard_size > 0) {
    in.dp_world_size = c.zero_optimization.mics_shard_size;
  }
  if (in.stage == 3) {
    in.hpz_partition_size = std::min(c.zero_optimization.zero_hpz_partition_size, in.dp_world_size);
  }
  in.param_bytes = c.fp16.enabled || c.bf16.enabled ? 2 : 4;
  std::string type;
  for (char ch : c.optimizer.type) {
    if (ch != '_') type += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  }
  if (!c.optimizer.present) {
    in.optimizer_state_bytes_per_param = 0;
  } else if (type == "lion" || type == "adagrad" || type == "sgd") {
    in.optimizer_state_bytes_per_param = 4;
  } else {
    // The Adam family and LAMB: two fp32 moments. Muon's matrices keep one, its Adam half
    // two: the formula takes the bound.
    in.optimizer_state_bytes_per_param = 8;
  }
  const bool bf16_masters = c.bf16.enabled && c.bf16.bf16_master_weights_and_grads;
  in.low_precision_masters =
      bf16_masters || (c.fp16.enabled && c.fp16.fp16_master_weights_and_grads);
  // bf16_optimizer_states: the moments in bf16.
  if (bf16_masters && c.bf16.bf16_optimizer_states) in.optimizer_state_bytes_per_param /= 2;
  in.on_cpu = on_cpu;
  in.offload_optimizer = c.zero_optimization.optimizer_offload() != OffloadDevice::kNone;
  in.offload_param = c.zero_optimization.param_offload() != OffloadDevice::kNone;
  in.reduce_bucket_size = c.zero_optimization.reduce_bucket_size;
  in.overlap_comm = c.zero_optimization.overlap_comm_enabled();
  in.reduce_scatter = c.zero_optimization.reduce_scatter && !on_cpu;
  in.largest_param_numel = largest_param_numel;
  return in;
}

std::string describe_model_state_bytes(const ModelStateInputs& in, const ModelStateBytes& m) {
  char buf[512];
  std::snprintf(buf, sizeof(buf),
                "ZeRO-%lld, W=%lld, %lld parameters: device %.2f MB (parameters %.2f, master weights "
                "%.2f, gradients %.2f, optimizer states %.2f, reduction buffers %.2f, offloaded %.2f), "
                "peak %.2f MB",
                static_cast<long long>(in.stage), static_cast<long long>(in.dp_world_size),
                static_cast<long long>(in.num_params), m.device() / 1e6, m.params / 1e6,
                m.master_params / 1e6, m.grads / 1e6, m.optimizer_states / 1e6,
                m.reduction_buffers / 1e6, (m.offloaded_optimizer + m.offloaded_params) / 1e6,
                m.device_peak() / 1e6);
  return buf;
}

}  // namespace deepspeed
