// ggml's tensor types decoded to fp32: the plain ones (F32, F16, BF16), the 32-value block
// formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL) and the 256-value k-quants (Q2_K, Q3_K, Q4_K,
// Q5_K, Q6_K, IQ4_XS) that llama.cpp's Q*_K_S/M/L and IQ4 files are made of. Owns the type
// table; gguf_file.h finds the bytes, ggml_block_formats.h decodes one block.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace deepspeed::examples {

/// Bytes that `numel` values of ggml type `type` occupy, or nullopt for a type this reader does
/// not decode, or when numel is not a whole number of blocks.
std::optional<uint64_t> ggml_type_nbytes(uint32_t type, int64_t numel);
/// "Q4_K", "F32", "IQ2_XXS", ... for every type ggml defines; "unknown" for other ids.
const char* ggml_type_name(uint32_t type);
/// Values per block of a type this reader decodes (1 for the plain types), or 0.
int64_t ggml_block_values(uint32_t type);
/// The types this reader decodes, for error messages: "F32, F16, ..., IQ4_XS".
std::string ggml_decoded_type_names();

/// Decodes `numel` values of `type` from `src` (ggml_type_nbytes(type, numel) bytes) into
/// `dst`. The values are bit-identical to gguf-py's dequantize. Parallel over blocks.
void dequantize_to_float(uint32_t type, const uint8_t* src, int64_t numel, float* dst);

}  // namespace deepspeed::examples
