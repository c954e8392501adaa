// ZeRO++'s qgZ (zero_optimization.zero_quantized_gradients): ZeRO-3's gradient reduce-scatter
// as two all-to-alls of 4-bit blocks, one inside each node and one across the nodes.
//
// Note [Quantized reduction]: W = N nodes of L ranks (rank n * L + l, stage3_groups.h's
// NodeGroups). Each rank holds a bucket of W rows, row r destined for rank r (already divided
// for the average). First, inside the node, this rank sends local rank l' the N rows of ranks
// (n, l') for every node n, quantized to 4 bits (block_quantizer.h, groups of at most 2,048
// elements), and sums what its L node peers sent it: the node's sum of the rows of ranks
// (n, l) for every n. Then, across the nodes, it sends node n' the row of rank (n', l),
// quantized again, and sums what the N nodes sent it: the sum over all W ranks of its own row.
// The inter-node links carry each rank's row once, in 4 bits (an eighth of fp32's bytes) where
// a reduce-scatter carries fp32 or 16-bit, at the cost of two roundings (each within half a
// step, 6 % of its group's largest magnitude). DeepSpeed's all_to_all_quant_reduce, with its
// layout: DeepSpeed reduces a 1-D gradient, or one whose numel 2W does not divide, by a plain
// reduce-scatter (its kernels' constraints); here every bucket takes this path. The first stage
// (inside the node, the larger) is started asynchronously, so that with overlap_comm it runs
// while backward goes on (DeepSpeed runs both in its reduction stream); the second completes
// when the bucket is taken out.
// With LoCo (zeropp_loco_param), each stage compensates what it sends by the error it carries
// (Note [LoCo error feedback]).
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "deepspeed/comm.h"
#include "runtime/zero/loco_error_feedback.h"
#include "runtime/zero/stage3_groups.h"

namespace deepspeed::runtime {

/// Bits and group target of qgZ's blocks (Note [Quantized reduction]).
constexpr int kGradientBits = 4;
constexpr int64_t kGradientGroupNumel = 2048;

/// Note [Quantized reduction]: `rows` [W, R] (row r for rank r, any floating dtype) -> `out`
/// (R elements) = the sum over every rank of its row for this rank. Collective over both groups.
/// `loco`: the bucket's LoCo errors, used and updated (Note [LoCo error feedback]).
void quantized_reduce_scatter(at::Tensor& out, const at::Tensor& rows, const NodeGroups& groups,
                              LocoBucketErrors* loco = nullptr);

/// quantized_reduce_scatter in two calls: the first stage in flight.
struct QuantizedReductionInFlight {
  std::vector<comm::Handle> handles;  // the first stage's all-to-alls (values, steps)
  at::Tensor sent_values, sent_scales;  // what they read, kept until they complete
  at::Tensor got_values, got_scales;    // what they write
  int64_t row_numel = 0;                // R
  LocoBucketErrors* loco = nullptr;
};
/// Quantizes `rows` (which may change once this returns) and starts the first stage; the
/// caller may take the handles and wait for them itself.
QuantizedReductionInFlight start_quantized_reduce_scatter(const at::Tensor& rows,
                                                          const NodeGroups& groups,
                                                          LocoBucketErrors* loco = nullptr);
/// Waits for the first stage (what is left of its handles), runs the second and writes `out`.
void finish_quantized_reduce_scatter(QuantizedReductionInFlight& flight, at::Tensor& out,
                                     const NodeGroups& groups);

}  // namespace deepspeed::runtime
