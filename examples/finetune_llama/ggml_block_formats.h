// One decoder per ggml block format: a block's bytes in, its values out as fp32. Internal to
// gguf_dequantize.cpp, which owns the type table (ids, names, sizes) and the parallel loop.
//
// Every decoder reproduces gguf-py's dequantize bit for bit: scales widen from fp16 first, then
// the products and differences happen in fp32 in gguf-py's order (numpy rounds each operation,
// so the files building these are compiled without floating-point contraction).
#pragma once

#include <cstdint>

namespace deepspeed::examples::ggml_blocks {

/// Values per block of the legacy formats and of the k-quant super-blocks.
constexpr int kLegacyBlock = 32;
constexpr int kSuperBlock = 256;

using Decoder = void (*)(const uint8_t* block, float* out);

// 32 values per block (ggml_legacy_blocks.cpp).
void q4_0(const uint8_t* block, float* out);
void q4_1(const uint8_t* block, float* out);
void q5_0(const uint8_t* block, float* out);
void q5_1(const uint8_t* block, float* out);
void q8_0(const uint8_t* block, float* out);
void iq4_nl(const uint8_t* block, float* out);

// 256 values per super-block (ggml_k_blocks.cpp).
void q2_k(const uint8_t* block, float* out);
void q3_k(const uint8_t* block, float* out);
void q4_k(const uint8_t* block, float* out);
void q5_k(const uint8_t* block, float* out);
void q6_k(const uint8_t* block, float* out);
void iq4_xs(const uint8_t* block, float* out);

/// The fp16 at `p` (little-endian), widened.
float half_at(const uint8_t* p);

/// IQ4_NL's and IQ4_XS's 16 non-linear levels.
extern const int8_t kIq4Levels[16];

}  // namespace deepspeed::examples::ggml_blocks
