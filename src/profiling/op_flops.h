// FLOPs and MACs of one ATen operator call, from the shapes of its inputs and outputs. The
// formulas are DeepSpeed's flops profiler's (profiling/flops_profiler/profiler.py), keyed by the
// ATen operator that the C++ frontend calls for each torch.nn.functional / torch function that
// DeepSpeed patches. Only operators called directly by model code are costed (see
// op_recorder.h); what they call internally is not counted again.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include <ATen/core/ivalue.h>

namespace deepspeed::profiling::detail {

struct OpCost {
  int64_t flops = 0;
  int64_t macs = 0;
};

/// Whether `op` ("aten::linear") is in the cost table: counted, or (embedding) a module's own
/// operator that costs 0. Only such operators tie a call to the module owning a parameter input.
bool is_costed_op(std::string_view op);

/// Whether the operators that `op` calls are costed in its place: einsum (DeepSpeed counts its
/// optimal contraction; the bmm/mm calls it lowers to are that contraction).
bool is_transparent_op(std::string_view op);

/// The cost of one call of `op` with these inputs and outputs; {0, 0} for operators not in the
/// table or whose arguments are not tensors of the expected rank.
OpCost op_cost(std::string_view op, const std::vector<c10::IValue>& inputs,
               const std::vector<c10::IValue>& outputs);

}  // namespace deepspeed::profiling::detail
