// The cost table. Each entry names the DeepSpeed formula it follows; where this port counts
// differently it says why (docs/observability.md lists what is and is not counted).
#include "profiling/op_flops.h"

#include <functional>
#include <string>
#include <unordered_map>

namespace deepspeed::profiling::detail {
namespace {

using Args = std::vector<c10::IValue>;
using CostFn = std::function<OpCost(const Args&, const Args&)>;

const at::Tensor* tensor_at(const Args& a, size_t i) {
  if (i >= a.size() || !a[i].isTensor()) return nullptr;
  const at::Tensor& t = a[i].toTensor();
  return t.defined() ? &t : nullptr;
}

int64_t numel_at(const Args& a, size_t i) {
  const at::Tensor* t = tensor_at(a, i);
  return t ? t->numel() : 0;
}

int64_t prod_from(const at::Tensor& t, int64_t first_dim) {
  int64_t p = 1;
  for (int64_t d = first_dim; d < t.dim(); ++d) p *= t.size(d);
  return p;
}

// Matmul family (DeepSpeed's _matmul_flops_compute / _addmm_flops_compute): every output element
// is a dot product over the inner dimension K = the first operand's last dim. The added term of
// addmm / baddbmm costs one flop per output element (DeepSpeed adds the term's own numel, the
// same when it is full-sized; a broadcast bias still costs an add per output).
OpCost matmul_cost(const Args& in, const Args& out, size_t first, bool with_term) {
  const at::Tensor* a = tensor_at(in, first);
  const at::Tensor* o = tensor_at(out, 0);
  if (!a || !o || a->dim() == 0) return {};
  const int64_t macs = o->numel() * a->size(-1);
  return {2 * macs + (with_term ? o->numel() : 0), macs};
}

OpCost linear_cost(const Args& in, const Args& out) {
  // DeepSpeed's _linear_flops_compute: input.numel() * out_features MACs, 2 flops each. The bias
  // add is counted too (one flop per output element): the C++ frontend's torch::nn::Linear
  // lowers to addmm, or matmul + add_, which count it, and both paths must agree.
  const at::Tensor* w = tensor_at(in, 1);
  if (!w || w->dim() == 0) return {};
  const int64_t macs = numel_at(in, 0) * w->size(0);
  return {2 * macs + (tensor_at(in, 2) ? numel_at(out, 0) : 0), macs};
}

// Convolutions (DeepSpeed's _conv_flops_compute / _conv_trans_flops_compute): per output (conv)
// or input (transposed conv) position, kernel volume x in_channels/groups x out_channels MACs;
// the bias adds one flop per output element.
OpCost conv_cost(const Args& in, const Args& out, bool transposed) {
  const at::Tensor* x = tensor_at(in, 0);
  const at::Tensor* w = tensor_at(in, 1);
  const at::Tensor* o = tensor_at(out, 0);
  if (!x || !w || !o || w->dim() < 2) return {};
  // weight: [out, in/groups, k...] (conv) or [in, out/groups, k...] (transposed).
  const int64_t macs = (transposed ? x->numel() : o->numel()) * prod_from(*w, 1);
  const int64_t bias = tensor_at(in, 2) ? o->numel() : 0;
  return {2 * macs + bias, macs};
}

OpCost input_numel_cost(const Args& in, const Args&) { return {numel_at(in, 0), 0}; }
OpCost output_numel_cost(const Args&, const Args& out) { return {numel_at(out, 0), 0}; }

// Normalizations: 4 flops per element (mean, variance, normalize) plus 1 for the affine
// transform (DeepSpeed's _layer_norm / _group_norm / _instance_norm_flops_compute).
CostFn norm_cost(size_t weight_input) {
  return [weight_input](const Args& in, const Args&) -> OpCost {
    return {numel_at(in, 0) * (tensor_at(in, weight_input) ? 5 : 4), 0};
  };
}

OpCost batch_norm_cost(const Args& in, const Args&) {
  // batch_norm(input, weight, bias, running_mean, running_var, training, ...): DeepSpeed counts
  // statistics only in training; in eval it is a scale (and shift).
  const bool affine = tensor_at(in, 1) != nullptr;
  const bool training = in.size() > 5 && in[5].isBool() && in[5].toBool();
  return {numel_at(in, 0) * (training ? (affine ? 5 : 4) : (affine ? 2 : 1)), 0};
}

OpCost sdpa_cost(const Args& in, const Args&) {
  // DeepSpeed's _attn_flops_compute: q @ k^T and attn @ v.
  const at::Tensor* q = tensor_at(in, 0);
  const at::Tensor* k = tensor_at(in, 1);
  const at::Tensor* v = tensor_at(in, 2);
  if (!q || !k || !v || q->dim() < 2 || k->dim() < 2) return {};
  const int64_t macs =
      q->numel() * k->size(-2) + (q->numel() / q->size(-1)) * k->size(-2) * v->size(-1);
  return {2 * macs, macs};
}

const std::unordered_map<std::string, CostFn>& table() {
  static const auto* t = new std::unordered_map<std::string, CostFn>{
      {"linear", linear_cost},
      {"matmul", [](const Args& i, const Args& o) { return matmul_cost(i, o, 0, false); }},
      {"mm", [](const Args& i, const Args& o) { return matmul_cost(i, o, 0, false); }},
      {"bmm", [](const Args& i, const Args& o) { return matmul_cost(i, o, 0, false); }},
      {"addmm", [](const Args& i, const Args& o) { return matmul_cost(i, o, 1, true); }},
      {"baddbmm", [](const Args& i, const Args& o) { return matmul_cost(i, o, 1, true); }},
      {"conv1d", [](const Args& i, const Args& o) { return conv_cost(i, o, false); }},
      {"conv2d", [](const Args& i, const Args& o) { return conv_cost(i, o, false); }},
      {"conv3d", [](const Args& i, const Args& o) { return conv_cost(i, o, false); }},
      {"conv_transpose1d", [](const Args& i, const Args& o) { return conv_cost(i, o, true); }},
      {"conv_transpose2d", [](const Args& i, const Args& o) { return conv_cost(i, o, true); }},
      {"conv_transpose3d", [](const Args& i, const Args& o) { return conv_cost(i, o, true); }},
      {"convolution",
       [](const Args& i, const Args& o) {
         const bool transposed = i.size() > 6 && i[6].isBool() && i[6].toBool();
         return conv_cost(i, o, transposed);
       }},
      {"scaled_dot_product_attention", sdpa_cost},
      // Activations and softmax: one flop per input element (DeepSpeed's _relu_flops_compute,
      // _gelu_..., _softmax_...). relu6 is hardtanh in the C++ frontend.
      {"relu", input_numel_cost},
      {"relu_", input_numel_cost},
      {"prelu", input_numel_cost},
      {"elu", input_numel_cost},
      {"elu_", input_numel_cost},
      {"leaky_relu", input_numel_cost},
      {"leaky_relu_", input_numel_cost},
      {"hardtanh", input_numel_cost},
      {"hardtanh_", input_numel_cost},
      {"silu", input_numel_cost},
      {"silu_", input_numel_cost},
      {"gelu", input_numel_cost},
      {"softmax", input_numel_cost},
      {"layer_norm", norm_cost(2)},
      {"group_norm", norm_cost(2)},
      {"instance_norm", norm_cost(1)},
      {"batch_norm", batch_norm_cost},
      // Pooling: one flop per input element (DeepSpeed's _pool_flops_compute).
      {"avg_pool1d", input_numel_cost},
      {"avg_pool2d", input_numel_cost},
      {"avg_pool3d", input_numel_cost},
      {"max_pool1d", input_numel_cost},
      {"max_pool2d", input_numel_cost},
      {"max_pool3d", input_numel_cost},
      {"max_pool2d_with_indices", input_numel_cost},
      {"adaptive_avg_pool1d", input_numel_cost},
      {"adaptive_avg_pool2d", input_numel_cost},
      {"adaptive_avg_pool3d", input_numel_cost},
      {"adaptive_max_pool1d", input_numel_cost},
      {"adaptive_max_pool2d", input_numel_cost},
      {"adaptive_max_pool3d", input_numel_cost},
      // Upsampling: one flop per output element (what DeepSpeed's size / scale_factor
      // arithmetic computes).
      {"upsample_nearest1d", output_numel_cost},
      {"upsample_nearest2d", output_numel_cost},
      {"upsample_nearest3d", output_numel_cost},
      {"upsample_linear1d", output_numel_cost},
      {"upsample_bilinear2d", output_numel_cost},
      {"upsample_bicubic2d", output_numel_cost},
      {"upsample_trilinear3d", output_numel_cost},
      // Elementwise arithmetic: one flop per output element (DeepSpeed's _elementwise_flops_
      // compute for torch.add / torch.mul). C++ operators (a + b) reach the same ATen operators
      // as the named calls, so sub/div and the in-place forms are counted alike.
      {"add", output_numel_cost},
      {"add_", output_numel_cost},
      {"sub", output_numel_cost},
      {"sub_", output_numel_cost},
      {"rsub", output_numel_cost},
      {"mul", output_numel_cost},
      {"mul_", output_numel_cost},
      {"div", output_numel_cost},
      {"div_", output_numel_cost},
      // A module's own operator with no arithmetic: costs 0, but ties the call to the module.
      {"embedding", [](const Args&, const Args&) { return OpCost{}; }},
      {"embedding_bag", [](const Args&, const Args&) { return OpCost{}; }},
  };
  return *t;
}

std::string_view base_name(std::string_view op) {
  constexpr std::string_view kPrefix = "aten::";
  if (op.substr(0, kPrefix.size()) == kPrefix) op.remove_prefix(kPrefix.size());
  return op;
}

}  // namespace

bool is_costed_op(std::string_view op) { return table().count(std::string(base_name(op))) > 0; }

bool is_transparent_op(std::string_view op) { return base_name(op) == "einsum"; }

OpCost op_cost(std::string_view op, const std::vector<c10::IValue>& inputs,
               const std::vector<c10::IValue>& outputs) {
  auto it = table().find(std::string(base_name(op)));
  if (it == table().end()) return {};
  return it->second(inputs, outputs);
}

}  // namespace deepspeed::profiling::detail
