// LoCo (zero_optimization.zeropp_loco_param): error feedback for ZeRO++'s qgZ.
//
// Note [LoCo error feedback]: each of qgZ's two stages (Note [Quantized reduction]) rounds what
// it sends to 4 bits. Without feedback those roundings are lost; LoCo carries them into the next
// reduction of the same bucket instead. Per stage, with e the error carried so far (zero at
// first): the stage sends c = x + e quantized, reads back d = what its receivers will read, and
// keeps e <- beta * e + (1 - beta) * (c - d) for next time, beta being err_beta. With beta 0 this
// is classic error feedback: over K reductions the sums received add up to the sums sent plus
// e_0 - e_K, so the rounding no longer accumulates. As DeepSpeed's all_to_all_loco_quant_reduce:
// - the errors are kept between reductions in 8 bits (blockwise, block_quantizer.h), so a
//   bucket's errors take a quarter of its fp32 bytes, plus its node-sum's;
// - every reset_T + 1 reductions of a bucket its errors restart from zero (DeepSpeed counts
//   reductions of all tensors together and resets the next tensor; here each bucket counts
//   its own, the buckets being fixed, Note [Static buckets]);
// - on an fp16 overflow every error is dropped (the skipped step's gradients are not finite),
//   and when the loss scale changes the errors are rescaled with it, so that they stay in the
//   units of the next step's scaled gradients.
// The errors are not part of a checkpoint (DeepSpeed keeps them on the parameters only): a
// resumed run starts them from zero.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "deepspeed/config.h"
#include "runtime/zero/block_quantizer.h"

namespace deepspeed::runtime {

/// One stage's carried error (Note [LoCo error feedback]), for rows of a fixed shape.
class StageError {
 public:
  /// `rows` [D, n] plus the carried error, in float (`rows` in float when none is carried).
  at::Tensor compensate(const at::Tensor& rows) const;
  /// Blends the rounding of this reduction in: e <- beta * e + (1 - beta) * (sent - read_back),
  /// both [D, n] float, and keeps e in 8 bits.
  void update(const at::Tensor& sent, const at::Tensor& read_back, double beta);
  void reset() { error_ = {}; }
  /// Multiplies the carried error by `ratio` (the loss scale's change).
  void rescale(double ratio);
  bool carried() const { return error_.values.defined(); }
  int64_t bytes() const;

 private:
  at::Tensor error() const;  // the carried error read back, [D, n] float
  QuantizedBlocks error_;  // flat, 8-bit; undefined: zero
  std::vector<int64_t> shape_;  // [D, n] of the rows it was kept for
};

/// A bucket's errors: one per stage of Note [Quantized reduction].
struct LocoBucketErrors {
  StageError intra_node;  // of the rows sent inside the node
  StageError inter_node;  // of the node's sums sent across the nodes
  double err_beta = 0.8;
};

/// Every bucket's errors of a ZeRO-3 gradient reducer (Note [LoCo error feedback]).
class LocoErrorFeedback {
 public:
  LocoErrorFeedback(LocoConfig config, size_t buckets);
  /// The errors bucket `b` reduces with now: zero on its first reduction and every
  /// reset_T + 1 reductions after.
  LocoBucketErrors& begin_reduction(size_t b);
  /// After the loss scaler's update: an overflow drops every error, a new scale rescales them.
  void loss_scale_updated(bool overflow, double ratio);
  int64_t bytes() const;

 private:
  struct Bucket {
    LocoBucketErrors errors;
    int64_t reductions = 0;  // since the last reset
  };
  LocoConfig config_;
  std::vector<Bucket> buckets_;
};

}  // namespace deepspeed::runtime
