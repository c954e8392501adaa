// The ggml type table and the parallel decode loop (see gguf_dequantize.h).
#include "gguf_dequantize.h"

#include <cstring>

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>

#include "ggml_block_formats.h"

namespace deepspeed::examples {
namespace {

namespace blocks = ggml_blocks;

struct TypeLayout {
  uint32_t type;
  const char* name;
  uint64_t block_bytes;   // bytes per block
  int64_t block_values;   // values per block
  blocks::Decoder decode; // nullptr for the plain types, which dequantize_to_float handles
};

// Sizes as ggml-common.h's block structs; ids as ggml.h's enum ggml_type.
constexpr TypeLayout kDecoded[] = {
    {0, "F32", 4, 1, nullptr},
    {1, "F16", 2, 1, nullptr},
    {30, "BF16", 2, 1, nullptr},
    {2, "Q4_0", 2 + 16, blocks::kLegacyBlock, blocks::q4_0},
    {3, "Q4_1", 2 + 2 + 16, blocks::kLegacyBlock, blocks::q4_1},
    {6, "Q5_0", 2 + 4 + 16, blocks::kLegacyBlock, blocks::q5_0},
    {7, "Q5_1", 2 + 2 + 4 + 16, blocks::kLegacyBlock, blocks::q5_1},
    {8, "Q8_0", 2 + 32, blocks::kLegacyBlock, blocks::q8_0},
    {20, "IQ4_NL", 2 + 16, blocks::kLegacyBlock, blocks::iq4_nl},
    {10, "Q2_K", 16 + 64 + 2 + 2, blocks::kSuperBlock, blocks::q2_k},
    {11, "Q3_K", 32 + 64 + 12 + 2, blocks::kSuperBlock, blocks::q3_k},
    {12, "Q4_K", 2 + 2 + 12 + 128, blocks::kSuperBlock, blocks::q4_k},
    {13, "Q5_K", 2 + 2 + 12 + 32 + 128, blocks::kSuperBlock, blocks::q5_k},
    {14, "Q6_K", 128 + 64 + 16 + 2, blocks::kSuperBlock, blocks::q6_k},
    {23, "IQ4_XS", 2 + 2 + 4 + 128, blocks::kSuperBlock, blocks::iq4_xs},
};

// ggml's other types, named in errors: grid-codebook quants, dot-product intermediates, integer
// and fp64 tensors, and the repacked Q4_0 layouts.
struct TypeName {
  uint32_t type;
  const char* name;
};
constexpr TypeName kNotDecoded[] = {
    {9, "Q8_1"},      {15, "Q8_K"},     {16, "IQ2_XXS"},  {17, "IQ2_XS"},   {18, "IQ3_XXS"},
    {19, "IQ1_S"},    {21, "IQ3_S"},    {22, "IQ2_S"},    {24, "I8"},       {25, "I16"},
    {26, "I32"},      {27, "I64"},      {28, "F64"},      {29, "IQ1_M"},    {31, "Q4_0_4_4"},
    {32, "Q4_0_4_8"}, {33, "Q4_0_8_8"}, {34, "TQ1_0"},    {35, "TQ2_0"},
};

const TypeLayout* layout_of(uint32_t type) {
  for (const auto& l : kDecoded) {
    if (l.type == type) return &l;
  }
  return nullptr;
}

}  // namespace

std::optional<uint64_t> ggml_type_nbytes(uint32_t type, int64_t numel) {
  const TypeLayout* l = layout_of(type);
  if (l == nullptr || numel < 0 || numel % l->block_values != 0) return std::nullopt;
  return static_cast<uint64_t>(numel / l->block_values) * l->block_bytes;
}

const char* ggml_type_name(uint32_t type) {
  if (const TypeLayout* l = layout_of(type)) return l->name;
  for (const auto& t : kNotDecoded) {
    if (t.type == type) return t.name;
  }
  return "unknown";
}

int64_t ggml_block_values(uint32_t type) {
  const TypeLayout* l = layout_of(type);
  return l != nullptr ? l->block_values : 0;
}

std::string ggml_decoded_type_names() {
  std::string names;
  for (const auto& l : kDecoded) {
    if (!names.empty()) names += ", ";
    names += l.name;
  }
  return names;
}

void dequantize_to_float(uint32_t type, const uint8_t* src, int64_t numel, float* dst) {
  const TypeLayout* l = layout_of(type);
  TORCH_CHECK(l != nullptr, "dequantize_to_float: ggml type ", type, " is not decoded");
  if (type == 0) {
    std::memcpy(dst, src, static_cast<size_t>(numel) * 4);
  } else if (type == 1) {
    at::parallel_for(0, numel, 1 << 16, [&](int64_t a, int64_t b) {
      for (int64_t i = a; i < b; ++i) dst[i] = blocks::half_at(src + 2 * i);
    });
  } else if (type == 30) {
    at::parallel_for(0, numel, 1 << 16, [&](int64_t a, int64_t b) {
      for (int64_t i = a; i < b; ++i) {
        uint16_t bits;
        std::memcpy(&bits, src + 2 * i, 2);
        dst[i] = static_cast<float>(c10::BFloat16(bits, c10::BFloat16::from_bits()));
      }
    });
  } else {
    // 8,192 values a task either way: 256 legacy blocks or 32 super-blocks.
    const int64_t grain = (1 << 13) / l->block_values;
    at::parallel_for(0, numel / l->block_values, grain, [&](int64_t a, int64_t b) {
      for (int64_t i = a; i < b; ++i) {
        l->decode(src + i * l->block_bytes, dst + i * l->block_values);
      }
    });
  }
}

}  // namespace deepspeed::examples
