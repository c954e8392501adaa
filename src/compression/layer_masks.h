// The pruning masks of a compressed layer (DeepSpeed's LinearLayer_Compress.get_mask): l1
// masks are the buffers init_compression computed; topk masks are the top scores, binarized
// with a straight-through gradient to the scores.
#pragma once

#include <ATen/core/Tensor.h>

#include "compression/layer_state.h"

namespace deepspeed::compression {

/// [out, in]-shaped (l1: the sparse_pruning_mask buffer; topk: sparse_mask_scores binarized).
at::Tensor sparse_mask(const LayerState& s);
/// [out, 1] (row_pruning_mask, or row_mask_scores binarized).
at::Tensor row_mask(const LayerState& s);
/// [1, num_heads] (head_pruning_scores binarized).
at::Tensor head_mask(const LayerState& s);
/// [out_channels, 1, 1, 1] (channel_pruning_mask, or channel_mask_scores binarized).
at::Tensor channel_mask(const LayerState& s);

/// The weight with the input columns of masked heads zeroed (head_pruning_reshape).
at::Tensor mask_heads(const at::Tensor& weight, const at::Tensor& mask, int64_t num_heads);

/// A registered tensor of `s`'s layer by name (an error naming the layer when missing).
at::Tensor registered(const LayerState& s, const std::string& name);

}  // namespace deepspeed::compression
