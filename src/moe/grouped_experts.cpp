// GroupedExperts (see auto_ep.h): one SwiGLU per expert over its contiguous block of rows.

#include <ATen/ATen.h>

#include "deepspeed/auto_ep.h"
#include "util/check.h"

namespace deepspeed::moe {

GroupedExpertsImpl::GroupedExpertsImpl(int64_t num_experts, int64_t hidden, int64_t ffn) {
  DS_CHECK(num_experts > 0 && hidden > 0 && ffn > 0, UsageError, "GroupedExperts: experts (",
           num_experts, "), hidden (", hidden, ") and ffn (", ffn, ") sizes must be positive");
  // transformers' initialisation of expert projections: N(0, 0.02).
  w1 = register_parameter("w1", at::empty({num_experts, ffn, hidden}).normal_(0.0, 0.02));
  w2 = register_parameter("w2", at::empty({num_experts, hidden, ffn}).normal_(0.0, 0.02));
  w3 = register_parameter("w3", at::empty({num_experts, ffn, hidden}).normal_(0.0, 0.02));
}

at::Tensor GroupedExpertsImpl::forward(const at::Tensor& rows, const std::vector<int64_t>& counts) {
  const auto n = static_cast<int64_t>(counts.size());
  DS_CHECK(n == w1.size(0), UsageError, "GroupedExperts: ", n, " row counts for ", w1.size(0),
           " experts");
  // unbind, not w1[e]: each select's backward would allocate a zero tensor of the whole stack
  // (E times the weights per step); unbind's stacks the experts' gradients once.
  const std::vector<at::Tensor> gate_w = w1.unbind(0), down_w = w2.unbind(0), up_w = w3.unbind(0);
  std::vector<at::Tensor> outs;
  outs.reserve(counts.size());
  int64_t start = 0;
  for (size_t e = 0; e < counts.size(); ++e) {
    const at::Tensor x = rows.narrow(0, start, counts[e]);
    start += counts[e];
    const at::Tensor gate = at::linear(x, gate_w[e]), up = at::linear(x, up_w[e]);
    outs.push_back(at::linear(at::silu(gate) * up, down_w[e]));
  }
  DS_CHECK(start == rows.size(0), UsageError, "GroupedExperts: the counts sum to ", start,
           " but there are ", rows.size(0), " rows");
  return at::cat(outs);
}

}  // namespace deepspeed::moe
