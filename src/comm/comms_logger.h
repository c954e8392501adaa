// The comms logger behind include/deepspeed/comms_logging.h: the hooks collectives.cpp calls at
// issue and at completion of every collective, and DeepSpeed's formulas (exposed for tests).
// Owns the records; does not issue collectives except in log_summary().
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace deepspeed::comm::detail {

/// Collective `seq` (this rank's sequence number) named `op` was issued on `tensor` (the
/// tensor DeepSpeed sizes the message by: all_reduce / broadcast: the tensor; all_gather: the
/// input, i.e. one rank's share; reduce_scatter: the input, i.e. all ranks' shares; barrier: 0
/// bytes) among `world_size` ranks (the group's size). A collective on a sub-group is recorded
/// as "<op> (group <group>)" so that its latencies are not mixed with the world's; `group` is
/// empty for the world. Costs one atomic load when the logger is disabled.
void comms_log_issue(int64_t seq, const char* op, const at::Tensor& tensor, int world_size,
                     const std::string& group = {});
/// Collective `seq` completed: records its latency. Unknown `seq` (issued while disabled) is
/// ignored.
void comms_log_complete(int64_t seq);

/// Algorithmic and bus bandwidth in Gbps for `size_bytes` moved by `op` in `latency_ms` among
/// `world_size` ranks (DeepSpeed's calc_bw_log; bytes/ms * 8 / 1e6 = Gbps):
///   all_reduce:            algbw = 2*S/t,  busbw = S/t * 2(n-1)/n
///   all_gather:            S *= n; algbw = S/t, busbw = S/t * (n-1)/n
///   reduce_scatter:        algbw = S/t, busbw = S/t * (n-1)/n (S is already all n shares; see
///                          docs/observability.md for why DeepSpeed's extra "*= n" is not copied)
///   all_to_all_single:     algbw = S/t, busbw = S/t * (n-1)/n
///   broadcast, reduce, gather, scatter, send, recv, barrier and any other op: both S/t.
struct Bandwidth {
  double algbw_gbps = 0.0;
  double busbw_gbps = 0.0;
};
Bandwidth calc_bw_log(const std::string& op, int64_t size_bytes, double latency_ms, int world_size);

/// DeepSpeed's convert_size: "0B", "4.0 B", "16.0 KB", "1.5 MB" (1024-based, 2 decimals, Python
/// float repr).
std::string convert_size(int64_t size_bytes);
/// DeepSpeed's trim_mean: drops round(n * trim_fraction) values at each end, then averages;
/// 0 for no data.
double trim_mean(std::vector<double> data, double trim_fraction);

}  // namespace deepspeed::comm::detail
