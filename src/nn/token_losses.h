// What chunked_cross_entropy and linear_cross_entropy share with cross_entropy: which targets
// count, and how per-token losses are reduced.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "deepspeed/cross_entropy.h"

namespace deepspeed::nn {

/// UsageError from `who` unless `target` is int64 and every entry other than `ignore_index` lies
/// in [0, vocab). On a GPU the range check runs on the device (no host synchronisation).
void check_class_targets(const at::Tensor& target, int64_t vocab, int64_t ignore_index,
                         const char* who);

/// cross_entropy's reductions of per-token losses (zero where ignored): kMean divides the sum by
/// the number of tokens that count (`counted`, bool), NaN when there are none.
at::Tensor reduce_token_losses(const at::Tensor& losses, const at::Tensor& counted,
                               LossReduction reduction);

}  // namespace deepspeed::nn
