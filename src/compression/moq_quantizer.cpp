// MoQ, DeepSpeed's runtime/quantize.py Quantizer (without eigenvalues, which DeepSpeed has
// disabled): the 16-bit weights quantized in place after each optimizer step.
#include <set>

#include <ATen/ATen.h>

#include "compression/layer_state.h"
#include "compression/quantizers.h"
#include "deepspeed/compression.h"
#include "deepspeed/errors.h"
#include "util/check.h"
#include "util/logging.h"

namespace deepspeed::compression {

// A weight's schedule (DeepSpeed keeps it as the parameter's start_bits / q_period).
struct MoqQuantizer::Layer {
  std::shared_ptr<LayerState> state;
  int64_t start_bits = 0, target_bits = 0, q_period = 0;
};

namespace {

// quantize_highbit: 3 bits or more, rounding to nearest or stochastic (uniform noise in
// [-0.5, 0.5) added before rounding).
at::Tensor quantize_highbit(const at::Tensor& w, int64_t bits, const TechniqueConfig& c) {
  const int64_t q_range = int64_t{1} << bits;
  const at::Tensor flat = w.reshape({c.quantize_groups, -1});
  const at::Tensor g_min = flat.amin({-1}, true);
  const at::Tensor g_max = flat.amax({-1}, true);
  at::Tensor noise;
  if (c.rounding != "nearest") noise = at::empty_like(flat).uniform_(-0.5, 0.5);
  auto add_noise = [&](const at::Tensor& t) { return noise.defined() ? t.add(noise) : t; };
  at::Tensor out;
  if (c.quantization_type == "symmetric") {
    const at::Tensor scale = at::max(g_min.abs(), g_max.abs()).mul(2).div(q_range);
    out = add_noise(flat.div(scale)).round().clamp(-(q_range >> 1), (q_range >> 1) - 1).mul(scale);
  } else {
    const at::Tensor scale = g_max.sub(g_min).div(q_range);
    const at::Tensor zero_point = g_min.div(scale).round().mul(scale);
    out = add_noise(flat.sub(zero_point).div(scale)).round().clamp(0, q_range - 1).mul(scale).add(
        zero_point);
  }
  return out.reshape(w.sizes()).contiguous();
}

}  // namespace

MoqQuantizer::MoqQuantizer(torch::nn::Module& model, const TechniqueConfig& weight_quantization)
    : config_(weight_quantization) {
  std::set<std::string> seen;
  for (const GroupConfig& g : config_.groups) {
    for (const auto& names : group_layers(model, "weight_quantization", g, seen, false)) {
      for (const std::string& name : names) {
        auto state = find_layer_state(module_named(model, name, "MoQ").get());
        DS_CHECK(state && state->weight_quantization, UsageError, "MoQ: ", name,
                 " has no weight quantization (run init_compression before initialize)");
        auto layer = std::make_shared<Layer>();
        layer->state = state;
        layer->start_bits = state->start_bits;
        layer->target_bits = state->target_bits;
        layer->q_period = state->q_period;
        layers_.push_back(std::move(layer));
      }
    }
  }
}

int64_t MoqQuantizer::current_bits(const torch::nn::Module& layer) const {
  for (const auto& l : layers_) {
    if (l->state->module.lock().get() == &layer) return l->start_bits;
  }
  throw UsageError("MoQ: the layer is not quantized");
}

void MoqQuantizer::set_steps(int64_t steps) {
  // quantize()'s schedule without the quantizing.
  for (int64_t step = qsteps_ + 1; step <= steps; ++step) {
    if (config_.fp16_mixed_quantize) {
      real_ratio_ = real_ratio_ > 0 ? real_ratio_ - config_.quantize_change_ratio : 0.0;
    }
    for (const auto& l : layers_) {
      if (l->start_bits != l->target_bits && step >= l->q_period) {
        real_ratio_ = 1.0;
        l->q_period <<= 1;
        l->start_bits -= 1;
      }
    }
  }
  qsteps_ = std::max(qsteps_, steps);
}

void MoqQuantizer::quantize(bool overflow) {
  if (overflow) return;
  qsteps_ += 1;
  if (config_.fp16_mixed_quantize) {
    real_ratio_ = real_ratio_ > 0 ? real_ratio_ - config_.quantize_change_ratio : 0.0;
  }
  at::NoGradGuard no_grad;
  for (const auto& l : layers_) {
    at::Tensor& w = l->state->weight();
    if (w.dim() <= 1) continue;
    // One bit fewer each time the step count reaches the period, which then doubles.
    if (l->start_bits != l->target_bits && qsteps_ >= l->q_period) {
      real_ratio_ = 1.0;
      l->q_period <<= 1;
      l->start_bits -= 1;
      if (config_.quantize_verbose) {
        log::info_rank0("Quantization settings: current bit-precision = " +
                        std::to_string(l->start_bits) + ", step = " + std::to_string(qsteps_) +
                        ", quantization period = " + std::to_string(l->q_period) + ", " +
                        l->state->name);
      }
    }
    // In fp32: LibTorch's CPU kernels lack fp16 rounding (DeepSpeed computes in the weight's
    // dtype on the GPU; the grid is the same, the last bit of a scale may differ).
    const at::Tensor x = w.detach().to(at::kFloat);
    at::Tensor q = l->start_bits >= 3   ? quantize_highbit(x, l->start_bits, config_)
                   : l->start_bits == 2 ? quantize_ternary(x, config_.quantize_groups)
                                        : quantize_binary(x, config_.quantize_groups);
    if (config_.fp16_mixed_quantize) q = x.mul(real_ratio_).add(q.mul(1 - real_ratio_));
    w.copy_(q);
  }
}

}  // namespace deepspeed::compression
