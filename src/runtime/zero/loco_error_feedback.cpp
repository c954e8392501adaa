// LoCo's carried errors (Note [LoCo error feedback]).
#include "runtime/zero/loco_error_feedback.h"

#include <functional>
#include <numeric>

#include <ATen/ATen.h>

#include "runtime/zero/quantized_reduction.h"
#include "util/check.h"

namespace deepspeed::runtime {
namespace {

// The carried errors' bits: DeepSpeed keeps them as 8-bit blocks between reductions.
constexpr int kErrorBits = 8;

}  // namespace

at::Tensor StageError::error() const {
  const auto numel = std::accumulate(shape_.begin(), shape_.end(), int64_t{1}, std::multiplies<>());
  return dequantize_blocks(error_.values.view({1, -1}), error_.scales.view({1, -1}), at::kFloat,
                           kErrorBits)[0]
      .narrow(0, 0, numel)
      .view(shape_);
}

at::Tensor StageError::compensate(const at::Tensor& rows) const {
  at::Tensor x = rows.to(at::kFloat);
  if (!carried()) return x;
  DS_INTERNAL_ASSERT(rows.sizes().vec() == shape_, "a bucket's LoCo error changed shape");
  return x.add_(error());
}

void StageError::update(const at::Tensor& sent, const at::Tensor& read_back, double beta) {
  at::NoGradGuard no_grad;
  at::Tensor blended = (sent - read_back).mul_(1.0 - beta);
  if (carried() && beta != 0.0) blended.add_(error(), beta);
  error_ = quantize_blocks(blended.reshape({-1}), kErrorBits, kGradientGroupNumel);
  shape_ = sent.sizes().vec();
}

void StageError::rescale(double ratio) {
  if (carried()) error_.scales.mul_(ratio);
}

int64_t StageError::bytes() const {
  if (!carried()) return 0;
  return error_.values.numel() * static_cast<int64_t>(error_.values.element_size()) +
         error_.scales.numel() * static_cast<int64_t>(error_.scales.element_size());
}

LocoErrorFeedback::LocoErrorFeedback(LocoConfig config, size_t buckets)
    : config_(config), buckets_(buckets) {
  for (auto& b : buckets_) b.errors.err_beta = config_.err_beta;
}

LocoBucketErrors& LocoErrorFeedback::begin_reduction(size_t b) {
  DS_INTERNAL_ASSERT(b < buckets_.size(), "LoCo has no errors for bucket ", b);
  Bucket& bucket = buckets_[b];
  // DeepSpeed's count: the reduction after reset_T + 1 of them starts from zero again.
  if (bucket.reductions > config_.reset_T) {
    bucket.errors.intra_node.reset();
    bucket.errors.inter_node.reset();
    bucket.reductions = 0;
  }
  bucket.reductions += 1;
  return bucket.errors;
}

void LocoErrorFeedback::loss_scale_updated(bool overflow, double ratio) {
  for (auto& b : buckets_) {
    if (overflow) {
      b.errors.intra_node.reset();
      b.errors.inter_node.reset();
      b.reductions = 0;
    } else if (ratio != 1.0) {
      b.errors.intra_node.rescale(ratio);
      b.errors.inter_node.rescale(ratio);
    }
  }
}

int64_t LocoErrorFeedback::bytes() const {
  int64_t total = 0;
  for (const auto& b : buckets_) total += b.errors.intra_node.bytes() + b.errors.inter_node.bytes();
  return total;
}

}  // namespace deepspeed::runtime
