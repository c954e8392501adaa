// Per-parameter communication dtypes. With torch_autocast, DeepSpeed marks the parameters of
// the lower-precision-safe modules (Linear, Conv) with a comm_dtype: their gradients are
// reduced, and under stage 3 their shards gathered, in the autocast dtype; every other
// parameter travels in its own dtype. Reducers keep the two kinds in separate buckets.
#pragma once

#include <unordered_map>

#include <ATen/core/Tensor.h>

namespace deepspeed::runtime {

/// The parameters that travel in another dtype than their reducer's, keyed by TensorImpl.
using CommDtypes = std::unordered_map<const c10::TensorImpl*, at::ScalarType>;

/// `param`'s communication dtype: its entry in `dtypes`, else `fallback`.
inline at::ScalarType comm_dtype_of(const CommDtypes& dtypes, const at::Tensor& param,
                                    at::ScalarType fallback) {
  auto it = dtypes.find(param.unsafeGetTensorImpl());
  return it == dtypes.end() ? fallback : it->second;
}

}  // namespace deepspeed::runtime
