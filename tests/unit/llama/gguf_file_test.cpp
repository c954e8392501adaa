// GGUF reader: layout, metadata, the block formats against values computed by hand, and the
// bad inputs (truncation, unknown type, bad magic), on files written by GgufTestWriter.
#include "gguf_file.h"

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "gguf_dequantize.h"
#include "gguf_test_writer.h"
#include "support/expect_throw.h"
#include "support/temp_dir.h"

namespace deepspeed::examples {
namespace {

using testing::GgufTestWriter;
using testing::TempDir;

std::vector<uint8_t> f32_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

void put_half(std::vector<uint8_t>& b, float x) {
  const uint16_t bits = c10::Half(x).x;
  b.push_back(static_cast<uint8_t>(bits & 0xFF));
  b.push_back(static_cast<uint8_t>(bits >> 8));
}

// One Q4_1 block: d = 0.5, m = -1, byte j = j | (15 - j) << 4.
std::vector<uint8_t> q4_1_block() {
  std::vector<uint8_t> b;
  put_half(b, 0.5f);
  put_half(b, -1.0f);
  for (int j = 0; j < 16; ++j) b.push_back(static_cast<uint8_t>(j | ((15 - j) << 4)));
  return b;
}

// One Q8_0 block: d = 0.25, q_j = j - 16.
std::vector<uint8_t> q8_0_block() {
  std::vector<uint8_t> b;
  put_half(b, 0.25f);
  for (int j = 0; j < 32; ++j) b.push_back(static_cast<uint8_t>(static_cast<int8_t>(j - 16)));
  return b;
}

GgufTestWriter sample_file() {
  GgufTestWriter w;
  w.kv_str("general.architecture", "llama");
  w.kv_u32("llama.block_count", 7);
  w.kv_f32("llama.rope.freq_base", 500000.0f);
  w.kv_bool("tokenizer.ggml.add_bos_token", false);
  w.kv_strs("tokenizer.ggml.tokens", {"a", "b", "<s>"});
  w.kv_i32s("tokenizer.ggml.token_type", {1, 1, 3});
  w.tensor("f32", {3, 2}, 0, f32_bytes({0, 1, 2, 3, 4, 5}));
  auto q41 = q4_1_block();
  auto two = q41;
  two.insert(two.end(), q41.begin(), q41.end());
  w.tensor("q4_1", {32, 2}, 3, two);
  w.tensor("q8_0", {32}, 8, q8_0_block());
  std::vector<uint8_t> f16;
  put_half(f16, 1.5f);
  put_half(f16, -2.0f);
  w.tensor("f16", {2}, 1, f16);
  return w;
}

TEST(GgufFile, ReadsHeaderMetadataAndTensorTable) {
  TempDir dir;
  sample_file().write(dir.file("m.gguf"));
  const auto f = GgufFile::open(dir.file("m.gguf"));
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.get_int("llama.block_count"), 7);
  EXPECT_DOUBLE_EQ(f.get_float("llama.rope.freq_base"), 500000.0);
  EXPECT_FALSE(f.metadata().at("tokenizer.ggml.add_bos_token").get<bool>());
  EXPECT_EQ(f.get_array("tokenizer.ggml.tokens").size(), 3u);
  EXPECT_EQ(f.get_array("tokenizer.ggml.token_type")[2].get<int>(), 3);
  ASSERT_EQ(f.tensors().size(), 4u);
  EXPECT_EQ(f.find_tensor("q4_1")->shape, (std::vector<int64_t>{2, 32}));  // torch order
  EXPECT_EQ(f.find_tensor("q4_1")->nbytes, 40u);
  EXPECT_EQ(f.find_tensor("f32")->offset % 32, 0u);
  EXPECT_THROW_WITH(f.get_int("llama.missing"), ModelFileError, "'llama.missing' is missing");
  EXPECT_THROW_WITH(f.get_int("general.architecture"), ModelFileError, "expected an integer");
}

TEST(GgufFile, DequantizesEachTypeToHandComputedValues) {
  TempDir dir;
  sample_file().write(dir.file("m.gguf"));
  const auto f = GgufFile::open(dir.file("m.gguf"));
  EXPECT_TRUE(torch::equal(f.load_tensor("f32", at::kFloat),
                           torch::arange(6, torch::kFloat).view({2, 3})));
  auto q41 = f.load_tensor("q4_1", at::kFloat);
  ASSERT_EQ(q41.sizes(), (std::vector<int64_t>{2, 32}));
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(q41[1][j].item<float>(), j * 0.5f - 1.0f) << j;
    EXPECT_EQ(q41[1][j + 16].item<float>(), (15 - j) * 0.5f - 1.0f) << j;
  }
  auto q80 = f.load_tensor("q8_0", at::kFloat);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(q80[j].item<float>(), (j - 16) * 0.25f) << j;
  auto f16 = f.load_tensor("f16", at::kFloat);
  EXPECT_EQ(f16[0].item<float>(), 1.5f);
  EXPECT_EQ(f16[1].item<float>(), -2.0f);
  auto bf = f.load_tensor("q8_0", at::kBFloat16);
  EXPECT_EQ(bf.scalar_type(), at::kBFloat16);
  EXPECT_EQ(bf[0].item<float>(), -4.0f);
}

TEST(GgufDequantize, Q4_0CentersNibblesOnEight) {
  std::vector<uint8_t> b;
  put_half(b, 2.0f);
  for (int j = 0; j < 16; ++j) b.push_back(static_cast<uint8_t>(j | ((15 - j) << 4)));
  std::vector<float> out(32);
  dequantize_to_float(2, b.data(), 32, out.data());
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(out[j], (j - 8) * 2.0f);
    EXPECT_EQ(out[j + 16], (7 - j) * 2.0f);
  }
  EXPECT_FALSE(ggml_type_nbytes(3, 31).has_value());  // not a whole block
  EXPECT_EQ(*ggml_type_nbytes(8, 64), 68u);
}

TEST(GgufFile, HonoursGeneralAlignment) {
  TempDir dir;
  auto w = sample_file();
  w.kv_u32("general.alignment", 64);
  w.write(dir.file("m.gguf"), 64);
  const auto f = GgufFile::open(dir.file("m.gguf"));
  EXPECT_EQ(f.alignment(), 64u);
  for (const auto& t : f.tensors()) EXPECT_EQ(t.offset % 64, 0u) << t.name;
  EXPECT_EQ(f.load_tensor("q8_0", at::kFloat)[31].item<float>(), 15 * 0.25f);
}

void write_prefix(const std::string& path, const std::vector<uint8_t>& bytes, size_t n) {
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()),
                                              static_cast<std::streamsize>(n));
}

TEST(GgufFile, TruncatedFileNamesFileAndWhatWasBeingRead) {
  TempDir dir;
  const auto bytes = sample_file().bytes();
  const std::string path = dir.file("cut.gguf");
  write_prefix(path, bytes, bytes.size() - 10);  // inside the last tensor's data
  EXPECT_THROW_WITH(GgufFile::open(path), ModelFileError, "is truncated: tensor 'f16'");
  EXPECT_THROW_WITH(GgufFile::open(path), ModelFileError, path);
  write_prefix(path, bytes, 60);  // inside the metadata
  EXPECT_THROW_WITH(GgufFile::open(path), ModelFileError, "is truncated");
  EXPECT_THROW_WITH(GgufFile::open(path), ModelFileError, "general.architecture");
  write_prefix(path, bytes, 2);
  EXPECT_THROW_WITH(GgufFile::open(path), ModelFileError, "the magic");
}

// An undecoded type (IQ2_XXS) and a partial block (128 values of 256-value Q4_K) are named with
// the tensor.
TEST(GgufFile, UnknownTypeAndPartialBlockNameTensorAndType) {
  TempDir dir;
  for (const auto& [type, values, words] :
       {std::tuple<uint32_t, uint64_t, std::string>{
            16, 256, "tensor 'w' has ggml type 16 (IQ2_XXS); this reader decodes F32, F16, BF16"},
        std::tuple<uint32_t, uint64_t, std::string>{
            12, 128, "tensor 'w' has 128 values of ggml type Q4_K, not a whole number of its "
                     "256-value blocks"}}) {
    GgufTestWriter w;
    w.tensor("w", {values, 1}, type, std::vector<uint8_t>(144));
    w.write(dir.file("k.gguf"));
    EXPECT_THROW_WITH(GgufFile::open(dir.file("k.gguf")), ModelFileError, words);
  }
}

TEST(GgufFile, RejectsOtherFormats) {
  TempDir dir;
  testing::write_text_file(dir.file("x.gguf"), "{\"not\": \"gguf\"}");
  EXPECT_THROW_WITH(GgufFile::open(dir.file("x.gguf")), ModelFileError, "not a GGUF file");
  EXPECT_THROW_WITH(GgufFile::open(dir.file("absent.gguf")), ModelFileError, "not found");
}

}  // namespace
}  // namespace deepspeed::examples
