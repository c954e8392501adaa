#include "compression/quantizers.h"

#include <cmath>

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include "util/check.h"

namespace deepspeed::compression {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Returns a precomputed value with the input's gradient passed through.
struct StraightThrough : torch::autograd::Function<StraightThrough> {
  static at::Tensor forward(AutogradContext*, const at::Tensor& /*x*/, const at::Tensor& value) {
    return value;
  }
  static variable_list backward(AutogradContext*, variable_list grad) {
    return {grad[0].clone(), at::Tensor()};
  }
};

}  // namespace

at::Tensor quantize_symmetric(const at::Tensor& x, int64_t bits, int64_t num_groups,
                              const std::optional<StaticRange>& range) {
  const int64_t q_range = int64_t{1} << bits;
  at::Tensor input = x;
  at::Tensor max_input;
  if (!range) {
    input = x.reshape({num_groups, -1});
    max_input = at::amax(at::abs(input), {-1}).view({num_groups, -1});
  } else {
    max_input = at::max(range->min.abs(), range->max).view({-1});
  }
  const at::Tensor scale = max_input.mul(2).div(q_range);
  const at::Tensor out =
      input.div(scale).round().clamp(-q_range / 2, q_range / 2 - 1).mul(scale);
  return out.reshape(x.sizes()).contiguous();
}

at::Tensor quantize_asymmetric(const at::Tensor& x, int64_t bits, int64_t num_groups,
                               const std::optional<StaticRange>& range) {
  const int64_t q_range = int64_t{1} << bits;
  at::Tensor input = x;
  at::Tensor min_value, max_value;
  if (!range) {
    input = x.reshape({num_groups, -1});
    min_value = input.amin({-1}, /*keepdim=*/true);
    max_value = input.amax({-1}, /*keepdim=*/true);
  } else {
    min_value = range->min;
    max_value = range->max;
  }
  const at::Tensor scale = max_value.sub(min_value).div(q_range);
  const at::Tensor zero_point = min_value.div(scale).round().mul(scale);
  const at::Tensor out =
      input.sub(zero_point).div(scale).round().clamp(0, q_range - 1).mul(scale).add(zero_point);
  return out.reshape(x.sizes()).contiguous();
}

at::Tensor quantize_ternary(const at::Tensor& x, int64_t num_groups) {
  const at::Tensor flat = x.reshape({num_groups, -1});
  const int64_t n = flat.size(1);
  const at::Tensor m = flat.norm(1, {1}).div(n);
  const at::Tensor thres = m.mul(0.7).view({-1, 1});
  const at::Tensor pos = flat.gt(thres).to(x.scalar_type());
  const at::Tensor neg = flat.lt(thres.neg()).to(x.scalar_type());
  const at::Tensor mask = flat.abs().gt(thres).to(x.scalar_type());
  const at::Tensor alpha = mask.mul(flat).abs().sum({1}).div(mask.sum({1})).view({-1, 1});
  return alpha.mul(pos).sub(alpha.mul(neg)).reshape(x.sizes()).contiguous();
}

at::Tensor quantize_binary(const at::Tensor& x, int64_t num_groups) {
  const at::Tensor flat = x.reshape({num_groups, -1});
  const int64_t n = flat.size(1);
  const at::Tensor m = flat.norm(1, {1}, /*keepdim=*/true).div(n);
  return flat.sign().mul(m).reshape(x.sizes()).contiguous();
}

at::Tensor quantize_weight(const at::Tensor& w, int64_t bits, const std::string& type,
                           int64_t num_groups) {
  DS_CHECK(w.numel() % num_groups == 0, ConfigError, "weight quantization: a weight of shape ",
           w.sizes(), " does not split into quantize_groups ", num_groups, " equal groups");
  if (bits >= 3) {
    return type == "symmetric" ? quantize_symmetric(w, bits, num_groups)
                               : quantize_asymmetric(w, bits, num_groups);
  }
  return bits == 2 ? quantize_ternary(w, num_groups) : quantize_binary(w, num_groups);
}

at::Tensor straight_through(const at::Tensor& x, const at::Tensor& quantized) {
  if (!x.requires_grad() || !at::GradMode::is_enabled()) return quantized;
  return StraightThrough::apply(x, quantized.detach());
}

at::Tensor topk_binarize(const at::Tensor& scores, double ratio) {
  at::Tensor mask;
  {
    at::NoGradGuard no_grad;
    mask = scores.detach().clone();
    const at::Tensor idx = std::get<1>(scores.detach().flatten().sort(/*dim=*/0,
                                                                      /*descending=*/true));
    const auto keep = static_cast<int64_t>(std::ceil(ratio * static_cast<double>(scores.numel())));
    at::Tensor flat = mask.view({-1});
    flat.index_fill_(0, idx.slice(0, keep), 0.0);     // idx[keep:]
    flat.index_fill_(0, idx.slice(0, 0, keep), 1.0);  // idx[:keep]
  }
  return straight_through(scores, mask);
}

}  // namespace deepspeed::compression
