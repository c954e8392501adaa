#include "compression/layer_masks.h"

#include <ATen/ATen.h>

#include "compression/quantizers.h"
#include "deepspeed/errors.h"

namespace deepspeed::compression {

at::Tensor registered(const LayerState& s, const std::string& name) {
  const auto module = s.module.lock();
  if (module) {
    if (const at::Tensor* p = module->named_parameters(/*recurse=*/false).find(name)) return *p;
    if (const at::Tensor* b = module->named_buffers(/*recurse=*/false).find(name)) return *b;
  }
  throw UsageError("compression: layer " + s.name + " has no " + name +
                   " (was init_compression run on this model?)");
}

at::Tensor sparse_mask(const LayerState& s) {
  if (s.sparse_method == "l1") return registered(s, "sparse_pruning_mask");
  return topk_binarize(registered(s, "sparse_mask_scores"), s.sparse_ratio);
}

at::Tensor row_mask(const LayerState& s) {
  if (s.row_method == "l1") return registered(s, "row_pruning_mask");
  return topk_binarize(registered(s, "row_mask_scores"), s.row_ratio);
}

at::Tensor channel_mask(const LayerState& s) {
  if (s.channel_method == "l1") return registered(s, "channel_pruning_mask");
  return topk_binarize(registered(s, "channel_mask_scores"), s.channel_ratio);
}

at::Tensor head_mask(const LayerState& s) {
  return topk_binarize(registered(s, "head_pruning_scores"), s.head_ratio);
}

at::Tensor mask_heads(const at::Tensor& weight, const at::Tensor& mask, int64_t num_heads) {
  const auto out = weight.size(0), in = weight.size(1);
  return weight.t().reshape({num_heads, -1}).mul(mask.view({-1, 1})).reshape({in, out}).t();
}

}  // namespace deepspeed::compression
