// ggml's block formats decoded to fp32: the quantized types finetune_llama meets (Q4_0, Q4_1,
// Q8_0) and the plain ones (F32, F16, BF16). Owns the byte layouts only; gguf_file.h finds the
// bytes. Each quantized block holds 32 values and fp16 scale(s), as ggml-common.h lays them out.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

namespace deepspeed::examples {

/// Bytes that `numel` values of ggml type `type` occupy, or nullopt for a type this reader does
/// not decode, or when numel is not a whole number of blocks.
std::optional<uint64_t> ggml_type_nbytes(uint32_t type, int64_t numel);
/// "Q4_1", "F32", ... or "type <id>" for others.
const char* ggml_type_name(uint32_t type);

/// Decodes `numel` values of `type` from `src` (ggml_type_nbytes(type, numel) bytes) into
/// `dst`. The values are bit-identical to gguf-py's dequantize (scales widened from fp16, then
/// q * d (+ m) in fp32). Parallel over blocks.
void dequantize_to_float(uint32_t type, const uint8_t* src, int64_t numel, float* dst);

}  // namespace deepspeed::examples
