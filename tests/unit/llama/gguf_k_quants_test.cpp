// The k-quant decoders against values worked out by hand from ggml's block layouts: the packed
// 6-bit scales and mins of Q4_K (sub-blocks 4-7 take their top bits from bytes 0-7), Q6_K's
// signed scales and split 6-bit quants, Q3_K's inverted high bit. gguf_dequantize_parity_test
// holds every format against gguf-py bit for bit; this one needs no Python.
#include <vector>

#include <c10/util/Half.h>
#include <gtest/gtest.h>

#include "gguf_dequantize.h"

namespace deepspeed::examples {
namespace {

constexpr uint32_t kQ3K = 11, kQ4K = 12, kQ6K = 14;

void set_half(std::vector<uint8_t>& b, size_t at, float x) {
  const uint16_t bits = c10::Half(x).x;
  b[at] = static_cast<uint8_t>(bits & 0xFF);
  b[at + 1] = static_cast<uint8_t>(bits >> 8);
}

std::vector<float> decode(uint32_t type, const std::vector<uint8_t>& block) {
  std::vector<float> out(256);
  EXPECT_EQ(*ggml_type_nbytes(type, 256), block.size());
  dequantize_to_float(type, block.data(), 256, out.data());
  return out;
}

TEST(GgufKQuants, Q4KUnpacksSixBitScalesAndMins) {
  std::vector<uint8_t> b(144, 0);
  set_half(b, 0, 0.5f);   // d
  set_half(b, 2, 0.25f);  // dmin
  uint8_t* s = b.data() + 4;
  // Sub-block 1: scale 17, min 3, in the low six bits of bytes 1 and 5.
  s[1] = 17;
  s[5] = 3;
  // Sub-block 6: scale 37 = 0b10'0101, min 50 = 0b11'0010. Low nibbles in byte 10 (scale low,
  // min high); top bits in bits 6-7 of byte 2 (scale) and byte 6 (min).
  s[10] = 0x5 | 0x2 << 4;
  s[2] |= 0b10 << 6;
  s[6] |= 0b11 << 6;
  // Every quant byte: low nibble 10, high nibble 3.
  for (int i = 16; i < 144; ++i) b[i] = 0x3A;
  const auto x = decode(kQ4K, b);
  // Sub-block 1 is chunk 0's high nibbles (q = 3); sub-block 6 chunk 3's low ones (q = 10).
  EXPECT_EQ(x[32], 0.5f * 17 * 3 - 0.25f * 3);
  EXPECT_EQ(x[63], 0.5f * 17 * 3 - 0.25f * 3);
  EXPECT_EQ(x[6 * 32], 0.5f * 37 * 10 - 0.25f * 50);
  EXPECT_EQ(x[6 * 32 + 31], 0.5f * 37 * 10 - 0.25f * 50);
  EXPECT_EQ(x[0], 0.0f);  // sub-block 0: scale and min 0
  // Sub-block 2's scale is byte 2's low six bits: 0, despite the top bits set for sub-block 6.
  EXPECT_EQ(x[2 * 32], 0.0f);
}

TEST(GgufKQuants, Q6KSignedScalesAndSixBitQuants) {
  std::vector<uint8_t> b(210, 0);
  for (int i = 0; i < 128; ++i) b[i] = 0x21;  // low nibbles: 1 for r < 64, 2 for r >= 64
  for (int i = 128; i < 192; ++i) b[i] = 0b11'10'01'00;  // high parts: r / 32
  for (int s = 0; s < 16; ++s) b[192 + s] = static_cast<uint8_t>(static_cast<int8_t>(s - 8));
  set_half(b, 208, 0.5f);
  const auto x = decode(kQ6K, b);
  for (int v = 0; v < 256; ++v) {
    const int r = v % 128;
    const int q = ((r < 64 ? 1 : 2) | (r / 32) << 4) - 32;
    EXPECT_EQ(x[v], 0.5f * static_cast<float>(v / 16 - 8) * static_cast<float>(q)) << v;
  }
}

TEST(GgufKQuants, Q3KSubtractsFourWhereTheHighBitIsClear) {
  std::vector<uint8_t> b(110, 0);
  b[0] = 0b0000'0001;  // value 0's high bit (bit 0 of byte 0) set; value 32's (bit 1) clear
  for (int i = 32; i < 96; ++i) b[i] = 0b11'10'01'11;  // 2-bit quants: 3, 1, 2, 3 by r / 32
  // Scales are stored plus 32. Scale 0: low nibble 1 of byte 0, top bits 0 -> 1 - 32 = -31.
  // Scale 2: low nibble 8 of byte 2, top bits 0b10 -> 40 - 32 = 8.
  b[96] = 0x1;
  b[96 + 2] = 0x8;
  b[96 + 8 + 2] = 0b10;  // scale 2's top bits (field 0 of byte 8 + 2)
  set_half(b, 108, 0.25f);
  const auto x = decode(kQ3K, b);
  EXPECT_EQ(x[0], 0.25f * -31 * 3);         // high bit set: q = 3
  EXPECT_EQ(x[1], 0.25f * -31 * (3 - 4));   // value 1: bit 0 of byte 1, clear
  EXPECT_EQ(x[32], 0.25f * 8 * (1 - 4));    // sub-block 2, second crumb, high bit clear
  EXPECT_EQ(x[16], 0.25f * -32 * (3 - 4));  // sub-block 1: scale 0 - 32
}

TEST(GgufKQuants, SizesAndNames) {
  EXPECT_EQ(*ggml_type_nbytes(10, 512), 2u * 84);    // Q2_K
  EXPECT_EQ(*ggml_type_nbytes(13, 256), 176u);       // Q5_K
  EXPECT_EQ(*ggml_type_nbytes(23, 256), 136u);       // IQ4_XS
  EXPECT_EQ(*ggml_type_nbytes(7, 64), 2u * 24);      // Q5_1
  EXPECT_FALSE(ggml_type_nbytes(kQ4K, 32).has_value());
  EXPECT_FALSE(ggml_type_nbytes(15, 256).has_value());  // Q8_K: not a file format
  EXPECT_STREQ(ggml_type_name(15), "Q8_K");
  EXPECT_STREQ(ggml_type_name(99), "unknown");
  EXPECT_EQ(ggml_block_values(kQ6K), 256);
  EXPECT_EQ(ggml_block_values(20), 32);  // IQ4_NL
}

}  // namespace
}  // namespace deepspeed::examples
