// ZeRO++'s qgZ reduction (Note [Quantized reduction]).
#include "runtime/zero/quantized_reduction.h"

#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "runtime/zero/block_quantizer.h"
#include "util/check.h"

namespace deepspeed::runtime {
namespace {

struct QuantizedRows {
  at::Tensor values;  // [D, bytes]
  at::Tensor scales;  // [D, G]
};

// Row d of `rows` [D, n] as 4-bit blocks, for group rank d. With `error`, LoCo's: the rows are
// compensated by the carried error first, and the rounding is carried on (Note [LoCo error
// feedback]); it needs only what this rank sends, so it is settled here.
QuantizedRows quantize_rows(const at::Tensor& rows, StageError* error, double err_beta) {
  const at::Tensor sent = error != nullptr ? error->compensate(rows) : rows;
  std::vector<at::Tensor> values, scales;
  for (int64_t d = 0; d < sent.size(0); ++d) {
    QuantizedBlocks q = quantize_blocks(sent[d], kGradientBits, kGradientGroupNumel);
    values.push_back(std::move(q.values));
    scales.push_back(std::move(q.scales));
  }
  QuantizedRows out{at::stack(values), at::stack(scales)};
  if (error != nullptr) {
    const at::Tensor read = dequantize_blocks(out.values, out.scales, at::kFloat, kGradientBits)
                                .narrow(1, 0, rows.size(1));
    error->update(sent, read, err_beta);
  }
  return out;
}

// The rows received, read back in float: [D, n].
at::Tensor read_back(const QuantizedRows& got, int64_t n) {
  return dequantize_blocks(got.values, got.scales, at::kFloat, kGradientBits).narrow(1, 0, n);
}

// Sends `sent`'s row d to group rank d; returns what group rank d sent this one, in row d.
QuantizedRows all_to_all(const QuantizedRows& sent, const comm::Group& group, bool async,
                         std::vector<comm::Handle>* handles) {
  QuantizedRows got{at::empty_like(sent.values), at::empty_like(sent.scales)};
  handles->push_back(comm::all_to_all_single(got.values, sent.values, async, group));
  handles->push_back(comm::all_to_all_single(got.scales, sent.scales, async, group));
  return got;
}

StageError* inter_node_error(LocoBucketErrors* loco) {
  return loco != nullptr ? &loco->inter_node : nullptr;
}

double beta_of(const LocoBucketErrors* loco) { return loco != nullptr ? loco->err_beta : 0.0; }

}  // namespace

QuantizedReductionInFlight start_quantized_reduce_scatter(const at::Tensor& rows,
                                                          const NodeGroups& groups,
                                                          LocoBucketErrors* loco) {
  at::NoGradGuard no_grad;
  const int64_t nodes = groups.inter_node.size();
  const int64_t per_node = groups.intra_node.size();
  const int64_t r = rows.size(1);
  DS_INTERNAL_ASSERT(rows.dim() == 2 && rows.size(0) == nodes * per_node,
                     "quantized_reduce_scatter takes [W, R] rows");
  // Inside the node: local rank l' gets the rows of ranks (n, l') for every node n.
  const at::Tensor by_local =
      rows.view({nodes, per_node, r}).transpose(0, 1).reshape({per_node, -1});
  StageError* intra = loco != nullptr ? &loco->intra_node : nullptr;
  QuantizedRows sent = quantize_rows(by_local, intra, beta_of(loco));
  QuantizedReductionInFlight flight;
  flight.row_numel = r;
  flight.loco = loco;
  QuantizedRows got = all_to_all(sent, groups.intra_node, /*async=*/true, &flight.handles);
  flight.sent_values = std::move(sent.values);
  flight.sent_scales = std::move(sent.scales);
  flight.got_values = std::move(got.values);
  flight.got_scales = std::move(got.scales);
  return flight;
}

void finish_quantized_reduce_scatter(QuantizedReductionInFlight& flight, at::Tensor& out,
                                     const NodeGroups& groups) {
  at::NoGradGuard no_grad;
  for (auto& h : flight.handles) h.wait();
  flight.handles.clear();
  const int64_t nodes = groups.inter_node.size();
  const int64_t r = flight.row_numel;
  DS_INTERNAL_ASSERT(out.numel() == r, "quantized_reduce_scatter writes R outputs");
  // The node's sums of the rows of ranks (n, l) for every node n: [N * R].
  const at::Tensor node_sums =
      read_back({flight.got_values, flight.got_scales}, nodes * r).sum(0);
  LocoBucketErrors* loco = flight.loco;
  flight = {};  // the first stage's buffers go
  // Across the nodes: node n' gets this node's sum of the rows of rank (n', l).
  const QuantizedRows sent =
      quantize_rows(node_sums.view({nodes, r}), inter_node_error(loco), beta_of(loco));
  std::vector<comm::Handle> handles;
  const QuantizedRows got = all_to_all(sent, groups.inter_node, /*async=*/false, &handles);
  out.view({-1}).copy_(read_back(got, r).sum(0));
}

void quantized_reduce_scatter(at::Tensor& out, const at::Tensor& rows, const NodeGroups& groups,
                              LocoBucketErrors* loco) {
  QuantizedReductionInFlight flight = start_quantized_reduce_scatter(rows, groups, loco);
  finish_quantized_reduce_scatter(flight, out, groups);
}

}  // namespace deepspeed::runtime
