// 1-bit compression: the padded layout, sign packing and error-compensated compression shared
// by the compressed all-reduce's worker and server sides.
#include <algorithm>
#include <cmath>
#include <numeric>

#include <ATen/ATen.h>

#include "deepspeed/onebit.h"
#include "util/check.h"

namespace deepspeed::onebit {
namespace {

// Bit weights of one byte, most significant first (numpy/cupy packbits' "big" order).
at::Tensor bit_weights() {
  static const at::Tensor w =
      at::tensor(std::vector<uint8_t>{128, 64, 32, 16, 8, 4, 2, 1}, at::kByte);
  return w;
}

}  // namespace

int64_t CompressionLayout::valid_in_chunk(int server) const {
  const int64_t start = static_cast<int64_t>(server) * chunk_numel;
  return std::clamp<int64_t>(numel - start, 0, chunk_numel);
}

CompressionLayout compression_layout(int64_t numel, int world_size) {
  DS_CHECK(world_size >= 1 && numel >= 0, UsageError, "compression_layout(", numel, ", ",
           world_size, "): expected numel >= 0 and a world size >= 1");
  CompressionLayout l;
  l.numel = numel;
  l.world_size = world_size;
  // DeepSpeed's divider: lcm(world, 8), so that every server chunk is whole bytes.
  const int64_t divider = static_cast<int64_t>(world_size) * 8 / std::gcd(world_size, 8);
  const int64_t unit = static_cast<int64_t>(world_size) * divider;
  l.padded_numel = (numel + unit - 1) / unit * unit;
  if (l.padded_numel == 0) l.padded_numel = unit;
  l.chunk_numel = l.padded_numel / world_size;
  return l;
}

at::Tensor pack_signs(const at::Tensor& x) {
  DS_CHECK(x.numel() % 8 == 0, UsageError, "pack_signs: ", x.numel(),
           " elements is not a multiple of 8; pad with compression_layout()");
  at::Tensor positive = x.reshape({-1, 8}).ge(0).to(at::kByte);
  return positive.mul(bit_weights()).sum(1).to(at::kByte);
}

at::Tensor unpack_signs(const at::Tensor& bits) {
  DS_CHECK(bits.scalar_type() == at::kByte, UsageError, "unpack_signs: expected uint8 bits, got ",
           bits.scalar_type());
  at::Tensor set = bits.reshape({-1, 1}).bitwise_and(bit_weights()).ne(0);
  return set.to(at::kFloat).mul_(2.0).sub_(1.0).reshape({-1});
}

Compressed compress_with_error(const at::Tensor& x, at::Tensor& error, int64_t valid) {
  DS_CHECK(x.numel() == error.numel() && valid >= 0 && valid <= x.numel(), UsageError,
           "compress_with_error: tensor of ", x.numel(), " elements, error buffer of ",
           error.numel(), ", ", valid, " valid");
  at::Tensor flat = x.view({-1});
  at::Tensor err = error.view({-1});
  flat.add_(err);
  at::Tensor real = flat.narrow(0, 0, valid);
  // The scale keeps the root mean square of the compensated values (DeepSpeed's
  // ||x|| / sqrt(numel)), over the real elements only: padding would shrink it.
  at::Tensor scale = valid > 0 ? real.norm().div(std::sqrt(static_cast<double>(valid)))
                               : at::zeros({}, flat.options());
  at::Tensor signs = flat.ge(0).to(flat.scalar_type()).mul_(2.0).sub_(1.0);
  err.copy_(flat - signs * scale);
  if (valid < err.numel()) err.narrow(0, valid, err.numel() - valid).zero_();
  return {scale.reshape({1}), pack_signs(flat)};
}

}  // namespace deepspeed::onebit
