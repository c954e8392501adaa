// The compressed forwards (DeepSpeed's LinearLayer_Compress.forward and
// Embedding_Compress.forward) and the masks they apply.
#include <vector>

#include <ATen/ATen.h>
#include <torch/enum.h>
#include <torch/nn/functional/conv.h>
#include <torch/nn/functional/embedding.h>

#include "compression/layer_masks.h"
#include "compression/layer_state.h"
#include "compression/quantizers.h"
#include "deepspeed/compression.h"
#include "deepspeed/errors.h"
#include "util/check.h"

namespace deepspeed::compression {
namespace {

// QuantAct: the static range follows each training batch's min and max with momentum 0.95,
// starting from the first batch's.
StaticRange static_range(const LayerState& s, const at::Tensor& x) {
  const auto quant_act = s.module.lock()->named_children()["activation_quantizer"];
  at::Tensor range = quant_act->named_buffers()["x_min_max"];
  if (s.training()) {
    at::NoGradGuard no_grad;
    const at::Tensor x_min = x.detach().min();
    const at::Tensor x_max = x.detach().max();
    if (range[0].item<double>() == range[1].item<double>()) {
      range[0].copy_(x_min);
      range[1].copy_(x_max);
    }
    constexpr double kMomentum = 0.95;
    range[0].copy_(range[0] * kMomentum + x_min * (1 - kMomentum));
    range[1].copy_(range[1] * kMomentum + x_max * (1 - kMomentum));
  }
  return StaticRange{range[0], range[1]};
}

// LibTorch's CPU kernels lack fp16 rounding: quantized in fp32 there, then cast back.
at::Tensor computable(const at::Tensor& t) {
  return t.is_cpu() && t.scalar_type() == at::kHalf ? t.to(at::kFloat) : t;
}

at::Tensor quantize_activation(const LayerState& s, const at::Tensor& x) {
  const bool symmetric = s.activation_method.rfind("symmetric", 0) == 0;
  at::Tensor q;
  {
    at::NoGradGuard no_grad;
    const at::Tensor in = computable(x.detach());
    if (s.activation_method.find("dynamic") != std::string::npos) {
      // Token-wise for a Linear layer, sample-wise for a convolution.
      const int64_t groups = s.conv ? x.size(0) : x.numel() / x.size(-1);
      q = symmetric ? quantize_symmetric(in, s.activation_bits, groups)
                    : quantize_asymmetric(in, s.activation_bits, groups);
    } else {
      const StaticRange range = static_range(s, x);
      q = symmetric ? quantize_symmetric(in, s.activation_bits, 1, range)
                    : quantize_asymmetric(in, s.activation_bits, 1, range);
    }
  }
  return straight_through(x, q.to(x.scalar_type()));
}

at::Tensor quantized_weight(const LayerState& s) {
  const at::Tensor& w = s.weight();
  at::Tensor q;
  {
    at::NoGradGuard no_grad;
    q = quantize_weight(computable(w.detach()), s.target_bits, s.quantization_type,
                        s.quantize_groups);
  }
  return straight_through(w, q.to(w.scalar_type()));
}

bool quantizes_in_forward(const LayerState& s) {
  return s.weight_quantization && s.quantize_in_forward && s.weight_quantization_enabled;
}

// The weight every compressed forward starts from, in DeepSpeed's order: quantized when that
// is switched on, then masked by sparse pruning.
at::Tensor quantized_sparse_weight(const LayerState& s) {
  at::Tensor weight = quantizes_in_forward(s) ? quantized_weight(s) : s.weight();
  if (s.sparse_pruning_enabled && !s.sparse_method.empty()) {
    weight = weight * sparse_mask(s).view(s.weight().sizes());
  }
  return weight;
}

// Row (Linear) or channel (Conv2d) pruning: the masked outputs' weights and biases zeroed.
void mask_outputs(at::Tensor& weight, at::Tensor& bias, const at::Tensor& mask) {
  std::vector<int64_t> shape(weight.dim(), 1);
  shape[0] = -1;
  weight = weight * mask.view(shape);
  if (bias.defined()) bias = bias * mask.view({-1});
}

}  // namespace

bool is_compressed(const torch::nn::Module& layer) {
  return find_layer_state(&layer) != nullptr;
}

at::Tensor linear(const torch::nn::Linear& layer, const at::Tensor& x) {
  const auto state = find_layer_state(layer.get());
  if (!state) return layer.ptr()->forward(x);
  const LayerState& s = *state;
  at::Tensor weight = quantized_sparse_weight(s);
  at::Tensor bias = layer->bias;
  if (s.row_pruning_enabled && !s.row_method.empty()) mask_outputs(weight, bias, row_mask(s));
  if (s.head_pruning_enabled && !s.head_method.empty()) {
    weight = mask_heads(weight, head_mask(s), s.num_heads);
  }
  at::Tensor input = x;
  if (s.activation_quantization_enabled) input = quantize_activation(s, x);
  return at::linear(input, weight, bias);
}

at::Tensor embedding(const torch::nn::Embedding& layer, const at::Tensor& indices) {
  const auto state = find_layer_state(layer.get());
  if (!state || !quantizes_in_forward(*state)) return layer.ptr()->forward(indices);
  const auto& o = layer->options;
  namespace F = torch::nn::functional;
  return F::detail::embedding(indices, quantized_weight(*state), o.padding_idx(), o.max_norm(),
                              o.norm_type(), o.scale_grad_by_freq(), o.sparse());
}

at::Tensor conv2d(const torch::nn::Conv2d& layer, const at::Tensor& x) {
  const auto state = find_layer_state(layer.get());
  if (!state) return layer.ptr()->forward(x);
  const LayerState& s = *state;
  const auto& o = layer->options;
  DS_CHECK(torch::enumtype::get_enum_name(o.padding_mode()) == "kZeros", NotSupportedError,
           "compression: ", s.name, ": a compressed Conv2d with a padding_mode other than "
           "zeros is not supported yet");
  at::Tensor weight = quantized_sparse_weight(s);
  at::Tensor bias = layer->bias;
  if (s.channel_pruning_enabled && !s.channel_method.empty()) {
    mask_outputs(weight, bias, channel_mask(s));
  }
  at::Tensor input = x;
  if (s.activation_quantization_enabled) input = quantize_activation(s, x);
  namespace F = torch::nn::functional;
  return F::conv2d(input, weight, F::Conv2dFuncOptions()
                                      .bias(bias)
                                      .stride(o.stride())
                                      .padding(o.padding())
                                      .dilation(o.dilation())
                                      .groups(o.groups()));
}

}  // namespace deepspeed::compression
