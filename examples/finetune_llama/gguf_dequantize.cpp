// ggml block formats decoded to fp32 (see gguf_dequantize.h). Layouts per 32-value block:
//   Q4_0: fp16 d, 16 bytes of nibbles         x = (q - 8) * d
//   Q4_1: fp16 d, fp16 m, 16 bytes of nibbles  x = q * d + m
//   Q8_0: fp16 d, 32 int8                      x = q * d
// Nibbles: byte j holds value j in its low half and value j + 16 in its high half.
#include "gguf_dequantize.h"

#include <cstring>

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

namespace deepspeed::examples {
namespace {

constexpr int64_t kBlock = 32;

struct TypeLayout {
  uint32_t type;
  const char* name;
  uint64_t block_bytes;   // bytes per block
  int64_t block_values;   // values per block
};

constexpr TypeLayout kLayouts[] = {
    {0, "F32", 4, 1},          {1, "F16", 2, 1},           {30, "BF16", 2, 1},
    {2, "Q4_0", 2 + 16, kBlock}, {3, "Q4_1", 2 + 2 + 16, kBlock}, {8, "Q8_0", 2 + 32, kBlock},
};

const TypeLayout* layout_of(uint32_t type) {
  for (const auto& l : kLayouts) {
    if (l.type == type) return &l;
  }
  return nullptr;
}

float half_at(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
}

void decode_blocks(uint32_t type, const uint8_t* src, int64_t first, int64_t last, float* dst) {
  const uint64_t bb = layout_of(type)->block_bytes;
  for (int64_t b = first; b < last; ++b) {
    const uint8_t* blk = src + b * bb;
    float* out = dst + b * kBlock;
    if (type == static_cast<uint32_t>(3)) {  // Q4_1
      const float d = half_at(blk), m = half_at(blk + 2);
      const uint8_t* qs = blk + 4;
      for (int j = 0; j < 16; ++j) {
        out[j] = static_cast<float>(qs[j] & 0x0F) * d + m;
        out[j + 16] = static_cast<float>(qs[j] >> 4) * d + m;
      }
    } else if (type == 2) {  // Q4_0
      const float d = half_at(blk);
      const uint8_t* qs = blk + 2;
      for (int j = 0; j < 16; ++j) {
        out[j] = static_cast<float>(static_cast<int>(qs[j] & 0x0F) - 8) * d;
        out[j + 16] = static_cast<float>(static_cast<int>(qs[j] >> 4) - 8) * d;
      }
    } else {  // Q8_0
      const float d = half_at(blk);
      const auto* qs = reinterpret_cast<const int8_t*>(blk + 2);
      for (int j = 0; j < 32; ++j) out[j] = static_cast<float>(qs[j]) * d;
    }
  }
}

}  // namespace

std::optional<uint64_t> ggml_type_nbytes(uint32_t type, int64_t numel) {
  const TypeLayout* l = layout_of(type);
  if (l == nullptr || numel < 0 || numel % l->block_values != 0) return std::nullopt;
  return static_cast<uint64_t>(numel / l->block_values) * l->block_bytes;
}

const char* ggml_type_name(uint32_t type) {
  const TypeLayout* l = layout_of(type);
  return l != nullptr ? l->name : "unknown";
}

void dequantize_to_float(uint32_t type, const uint8_t* src, int64_t numel, float* dst) {
  switch (type) {
    case 0:
      std::memcpy(dst, src, static_cast<size_t>(numel) * 4);
      return;
    case 1:
      at::parallel_for(0, numel, 1 << 16, [&](int64_t a, int64_t b) {
        for (int64_t i = a; i < b; ++i) dst[i] = half_at(src + 2 * i);
      });
      return;
    case 30:
      at::parallel_for(0, numel, 1 << 16, [&](int64_t a, int64_t b) {
        for (int64_t i = a; i < b; ++i) {
          uint16_t bits;
          std::memcpy(&bits, src + 2 * i, 2);
          dst[i] = static_cast<float>(c10::BFloat16(bits, c10::BFloat16::from_bits()));
        }
      });
      return;
    default:
      at::parallel_for(0, numel / kBlock, 256, [&](int64_t a, int64_t b) {
        decode_blocks(type, src, a, b, dst);
      });
  }
}

}  // namespace deepspeed::examples
