// ZeRO++'s qgZ reduction (Note [Quantized reduction]).
#include "runtime/zero/quantized_reduction.h"

#include <vector>

#include <ATen/ATen.h>

#include "runtime/zero/block_quantizer.h"
#include "util/check.h"

namespace deepspeed::runtime {
namespace {

// Sends row d of `rows` [D, n] to group rank d as 4-bit blocks; returns what each group rank
// sent this one (row d from rank d), read back in float: [D, n]. With `error`, LoCo's: the rows
// sent are compensated by the carried error, and the rounding is carried on (Note [LoCo error
// feedback]).
at::Tensor exchange(const at::Tensor& rows, const comm::Group& group, StageError* error,
                    double err_beta) {
  const int64_t n = rows.size(1);
  const at::Tensor sent = error != nullptr ? error->compensate(rows) : rows;
  std::vector<at::Tensor> values, scales;
  for (int64_t d = 0; d < sent.size(0); ++d) {
    QuantizedBlocks q = quantize_blocks(sent[d], kGradientBits, kGradientGroupNumel);
    values.push_back(std::move(q.values));
    scales.push_back(std::move(q.scales));
  }
  const at::Tensor sent_values = at::stack(values);
  const at::Tensor sent_scales = at::stack(scales);
  at::Tensor got_values = at::empty_like(sent_values);
  at::Tensor got_scales = at::empty_like(sent_scales);
  comm::all_to_all_single(got_values, sent_values, /*async_op=*/false, group);
  comm::all_to_all_single(got_scales, sent_scales, /*async_op=*/false, group);
  if (error != nullptr) {
    const at::Tensor read_back =
        dequantize_blocks(sent_values, sent_scales, at::kFloat, kGradientBits).narrow(1, 0, n);
    error->update(sent, read_back, err_beta);
  }
  return dequantize_blocks(got_values, got_scales, at::kFloat, kGradientBits).narrow(1, 0, n);
}

}  // namespace

void quantized_reduce_scatter(at::Tensor& out, const at::Tensor& rows, const NodeGroups& groups,
                              LocoBucketErrors* loco) {
  at::NoGradGuard no_grad;
  const int64_t nodes = groups.inter_node.size();
  const int64_t per_node = groups.intra_node.size();
  const int64_t r = rows.size(1);
  DS_INTERNAL_ASSERT(rows.dim() == 2 && rows.size(0) == nodes * per_node && out.numel() == r,
                     "quantized_reduce_scatter takes [W, R] rows and R outputs");
  // Inside the node: local rank l' gets the rows of ranks (n, l') for every node n.
  const at::Tensor by_local =
      rows.view({nodes, per_node, r}).transpose(0, 1).reshape({per_node, -1});
  StageError* intra = loco != nullptr ? &loco->intra_node : nullptr;
  StageError* inter = loco != nullptr ? &loco->inter_node : nullptr;
  const double beta = loco != nullptr ? loco->err_beta : 0.0;
  const at::Tensor node_sums = exchange(by_local, groups.intra_node, intra, beta).sum(0);  // N*R
  // Across the nodes: node n' gets this node's sum of the rows of rank (n', l).
  const at::Tensor total =
      exchange(node_sums.view({nodes, r}), groups.inter_node, inter, beta).sum(0);
  out.view({-1}).copy_(total);
}

}  // namespace deepspeed::runtime
