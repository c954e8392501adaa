// 1-bit compression: the padded layout, sign packing and error-compensated compression shared
// by the compressed all-reduce's worker and server sides.
#include <algorithm>
#include <cmath>
#include <numeric>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "deepspeed/onebit.h"
#include "util/check.h"

namespace deepspeed::onebit {

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

// Plain loops: packing is on every compressed step's critical path, and the tensor-op version
// (compare, multiply by the bit weights, sum in int64) was several times slower on the CPU.
at::Tensor pack_signs(const at::Tensor& x) {
  DS_CHECK(x.numel() % 8 == 0, UsageError, "pack_signs: ", x.numel(),
           " elements is not a multiple of 8; pad with compression_layout()");
  at::Tensor values = x.reshape({-1}).to(at::kFloat).contiguous();
  at::Tensor out = at::empty({x.numel() / 8}, x.options().dtype(at::kByte));
  const float* in = values.data_ptr<float>();
  uint8_t* bytes = out.data_ptr<uint8_t>();
  const int64_t n = out.numel();
  at::parallel_for(0, n, 4096, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float* v = in + 8 * i;
      uint8_t b = 0;
      for (int k = 0; k < 8; ++k) b = static_cast<uint8_t>((b << 1) | (v[k] >= 0.0f ? 1 : 0));
      bytes[i] = b;
    }
  });
  return out;
}

at::Tensor unpack_signs(const at::Tensor& bits) {
  DS_CHECK(bits.scalar_type() == at::kByte, UsageError, "unpack_signs: expected uint8 bits, got ",
           bits.scalar_type());
  at::Tensor packed = bits.reshape({-1}).contiguous();
  at::Tensor out = at::empty({packed.numel() * 8}, bits.options().dtype(at::kFloat));
  const uint8_t* bytes = packed.data_ptr<uint8_t>();
  float* values = out.data_ptr<float>();
  at::parallel_for(0, packed.numel(), 4096, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      for (int k = 0; k < 8; ++k) values[8 * i + k] = (bytes[i] >> (7 - k)) & 1 ? 1.0f : -1.0f;
    }
  });
  return out;
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
