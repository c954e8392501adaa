// ggml's 256-value super-block formats, the k-quants (see ggml_block_formats.h). Each splits its
// 256 values into sub-blocks with a scale (and for Q2_K, Q4_K, Q5_K a min) of their own, the
// scales themselves quantized against the fp16 super-scale d (and dmin). Layouts, in byte order:
//   Q2_K:   16 scale bytes (low nibble scale, high nibble min), 64 bytes of 2-bit q, d, dmin
//           x = (d * scale) * q - dmin * min                    16 sub-blocks of 16
//   Q3_K:   32 bytes of high bits, 64 bytes of 2-bit q, 12 bytes of 6-bit scales, d
//           x = (d * (scale - 32)) * (q - (high ? 0 : 4))       16 sub-blocks of 16
//   Q4_K:   d, dmin, 12 bytes of 6-bit scales and mins, 128 bytes of nibbles
//           x = (d * scale) * q - dmin * min                    8 sub-blocks of 32
//   Q5_K:   as Q4_K with 32 bytes of fifth bits before the nibbles
//   Q6_K:   128 bytes of low nibbles, 64 bytes of 2-bit high parts, 16 int8 scales, d
//           x = (d * scale) * (q - 32)                          16 sub-blocks of 16
//   IQ4_XS: d, 2 bytes of scale high bits, 4 bytes of scale nibbles, 128 bytes of nibbles
//           x = (d * (scale - 32)) * level[q]                   8 sub-blocks of 32
// Where the bits of value v sit is spelled out in each decoder.
#include "ggml_block_formats.h"

#include <cstring>

namespace deepspeed::examples::ggml_blocks {
namespace {

// Q4_K's and Q5_K's 6-bit scale and min of sub-block j (0..7) from their 12 packed bytes:
// bytes 0-3 hold scales 0-3 in their low six bits, bytes 4-7 mins 0-3; sub-blocks 4-7 take their
// low four bits from the nibbles of bytes 8-11 and their top two from bytes 0-7's top bits.
void scale_min_k4(const uint8_t* s, int j, int& scale, int& min) {
  if (j < 4) {
    scale = s[j] & 0x3F;
    min = s[j + 4] & 0x3F;
  } else {
    scale = (s[j + 4] & 0x0F) | ((s[j - 4] >> 2) & 0x30);
    min = (s[j + 4] >> 4) | ((s[j] >> 2) & 0x30);
  }
}

// Q4_K's and Q5_K's nibble of value v: 32-byte chunk v / 64, low half for the first 32 values
// of the chunk, high half for the next.
int nibble_k4(const uint8_t* qs, int v) {
  const int chunk = v / 64, high = (v / 32) % 2;
  return (qs[chunk * 32 + v % 32] >> (4 * high)) & 0x0F;
}

// Q4_K's and Q5_K's common frame: d, dmin, the packed scales and mins at byte 4; `quant(v)` reads
// value v's unsigned quant.
template <class Quant>
void decode_k4(const uint8_t* block, float* out, Quant quant) {
  const float d = half_at(block), dmin = half_at(block + 2);
  for (int s = 0; s < 8; ++s) {
    int scale = 0, min = 0;
    scale_min_k4(block + 4, s, scale, min);
    const float dl = d * static_cast<float>(scale), ml = dmin * static_cast<float>(min);
    for (int v = s * 32; v < s * 32 + 32; ++v) out[v] = dl * static_cast<float>(quant(v)) - ml;
  }
}

// The 2-bit field of value v in Q2_K's and Q3_K's quant bytes: two halves of 128 values over 32
// bytes each; within a half, value r takes bits 2 * (r / 32) of byte r % 32.
int crumb(const uint8_t* qs, int v) {
  const int half = v / 128, r = v % 128;
  return (qs[half * 32 + r % 32] >> (2 * (r / 32))) & 0x03;
}

}  // namespace

void q2_k(const uint8_t* block, float* out) {
  const uint8_t* scales = block;
  const uint8_t* qs = block + 16;
  const float d = half_at(block + 80), dmin = half_at(block + 82);
  for (int s = 0; s < 16; ++s) {
    const float dl = d * static_cast<float>(scales[s] & 0x0F);
    const float ml = dmin * static_cast<float>(scales[s] >> 4);
    for (int v = s * 16; v < s * 16 + 16; ++v) {
      out[v] = dl * static_cast<float>(crumb(qs, v)) - ml;
    }
  }
}

void q3_k(const uint8_t* block, float* out) {
  const uint8_t* hmask = block;
  const uint8_t* qs = block + 32;
  const uint8_t* sc = block + 96;
  const float d = half_at(block + 108);
  for (int s = 0; s < 16; ++s) {
    // Low four bits: nibbles of bytes 0-7 (low halves for scales 0-7, high for 8-15); top two:
    // the 2-bit field s / 4 of byte 8 + s % 4.
    const int low = s < 8 ? sc[s] & 0x0F : sc[s - 8] >> 4;
    const int top = (sc[8 + s % 4] >> (2 * (s / 4))) & 0x03;
    const float dl = d * static_cast<float>((low | top << 4) - 32);
    for (int v = s * 16; v < s * 16 + 16; ++v) {
      // Value v's high bit is bit v / 32 of byte v % 32; a clear bit subtracts 4.
      const int high = (hmask[v % 32] >> (v / 32)) & 1;
      out[v] = dl * static_cast<float>(crumb(qs, v) - (high != 0 ? 0 : 4));
    }
  }
}

void q4_k(const uint8_t* block, float* out) {
  const uint8_t* qs = block + 16;
  decode_k4(block, out, [qs](int v) { return nibble_k4(qs, v); });
}

void q5_k(const uint8_t* block, float* out) {
  const uint8_t* qh = block + 16;
  const uint8_t* qs = block + 48;
  // The fifth bit of sub-block s's value i is bit s of byte i.
  decode_k4(block, out,
            [qh, qs](int v) { return nibble_k4(qs, v) | ((qh[v % 32] >> (v / 32)) & 1) << 4; });
}

void q6_k(const uint8_t* block, float* out) {
  const uint8_t* ql = block;
  const uint8_t* qh = block + 128;
  const auto* scales = reinterpret_cast<const int8_t*>(block + 192);
  const float d = half_at(block + 208);
  for (int s = 0; s < 16; ++s) {
    const float dl = d * static_cast<float>(scales[s]);
    for (int v = s * 16; v < s * 16 + 16; ++v) {
      // Two halves of 128 values. Low nibble: 64 bytes a half, low halves for the first 64
      // values, high for the next. High part: 32 bytes a half, 2-bit field r / 32 of byte r % 32.
      const int half = v / 128, r = v % 128;
      const int low = (ql[half * 64 + r % 64] >> (4 * (r / 64))) & 0x0F;
      const int top = (qh[half * 32 + r % 32] >> (2 * (r / 32))) & 0x03;
      out[v] = dl * static_cast<float>((low | top << 4) - 32);
    }
  }
}

void iq4_xs(const uint8_t* block, float* out) {
  const float d = half_at(block);
  uint16_t scales_high;
  std::memcpy(&scales_high, block + 2, 2);
  const uint8_t* scales_low = block + 4;
  const uint8_t* qs = block + 8;
  for (int s = 0; s < 8; ++s) {
    const int low = (scales_low[s / 2] >> (4 * (s % 2))) & 0x0F;
    const int top = (scales_high >> (2 * s)) & 0x03;
    const float dl = d * static_cast<float>((low | top << 4) - 32);
    // Sub-block s is 16 bytes: values 0-15 in the low nibbles, 16-31 in the high ones.
    for (int i = 0; i < 32; ++i) {
      const int q = (qs[s * 16 + i % 16] >> (4 * (i / 16))) & 0x0F;
      out[s * 32 + i] = dl * static_cast<float>(kIq4Levels[q]);
    }
  }
}

}  // namespace deepspeed::examples::ggml_blocks
