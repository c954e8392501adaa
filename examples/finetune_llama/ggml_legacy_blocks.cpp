// ggml's 32-value block formats (see ggml_block_formats.h). Layouts, as ggml-common.h has them:
//   Q4_0:   fp16 d, 16 bytes of nibbles                    x = (q - 8) * d
//   Q4_1:   fp16 d, fp16 m, 16 bytes of nibbles            x = q * d + m
//   Q5_0:   fp16 d, 32 high bits, 16 bytes of nibbles      x = (q - 16) * d
//   Q5_1:   fp16 d, fp16 m, 32 high bits, 16 bytes         x = q * d + m
//   Q8_0:   fp16 d, 32 int8                                x = q * d
//   IQ4_NL: fp16 d, 16 bytes of nibbles                    x = level[q] * d
// Nibbles: byte j holds value j in its low half and value j + 16 in its high half. The high
// bits of Q5_*: bit j of a little-endian uint32 belongs to value j.
#include "ggml_block_formats.h"

#include <cstring>

#include <c10/util/Half.h>

namespace deepspeed::examples::ggml_blocks {

const int8_t kIq4Levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                               1,    13,   25,  38,  53,  69,  89,  113};

float half_at(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
}

namespace {

// The 4-bit value j of a nibble-packed run of 16 bytes.
int nibble(const uint8_t* qs, int j) { return j < 16 ? qs[j] & 0x0F : qs[j - 16] >> 4; }

uint32_t u32_at(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

}  // namespace

void q4_0(const uint8_t* block, float* out) {
  const float d = half_at(block);
  for (int j = 0; j < kLegacyBlock; ++j) {
    out[j] = static_cast<float>(nibble(block + 2, j) - 8) * d;
  }
}

void q4_1(const uint8_t* block, float* out) {
  const float d = half_at(block), m = half_at(block + 2);
  for (int j = 0; j < kLegacyBlock; ++j) {
    out[j] = static_cast<float>(nibble(block + 4, j)) * d + m;
  }
}

void q5_0(const uint8_t* block, float* out) {
  const float d = half_at(block);
  const uint32_t high = u32_at(block + 2);
  for (int j = 0; j < kLegacyBlock; ++j) {
    const int q = nibble(block + 6, j) | static_cast<int>((high >> j) & 1u) << 4;
    out[j] = static_cast<float>(q - 16) * d;
  }
}

void q5_1(const uint8_t* block, float* out) {
  const float d = half_at(block), m = half_at(block + 2);
  const uint32_t high = u32_at(block + 4);
  for (int j = 0; j < kLegacyBlock; ++j) {
    const int q = nibble(block + 8, j) | static_cast<int>((high >> j) & 1u) << 4;
    out[j] = static_cast<float>(q) * d + m;
  }
}

void q8_0(const uint8_t* block, float* out) {
  const float d = half_at(block);
  const auto* qs = reinterpret_cast<const int8_t*>(block + 2);
  for (int j = 0; j < kLegacyBlock; ++j) out[j] = static_cast<float>(qs[j]) * d;
}

void iq4_nl(const uint8_t* block, float* out) {
  const float d = half_at(block);
  for (int j = 0; j < kLegacyBlock; ++j) {
    out[j] = static_cast<float>(kIq4Levels[nibble(block + 2, j)]) * d;
  }
}

}  // namespace deepspeed::examples::ggml_blocks
