// safetensors: the byte layout of the spec (header length, JSON, aligned data), the round trip
// of every dtype, and truncated or malformed files.
#include <fstream>
#include <sstream>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "deepspeed/checkpoint.h"
#include "support/expect_throw.h"
#include "support/temp_dir.h"

namespace deepspeed::checkpoint {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(Safetensors, LayoutFollowsTheSpec) {
  testing::TempDir dir;
  TensorDict t;
  t.insert("b", at::tensor({1.0f, 2.0f, 3.0f}));
  t.insert("a", at::tensor({int64_t{7}}, at::kLong).reshape({1, 1}));
  save_safetensors(t, dir.file("m.safetensors"));
  const std::string bytes = read_file(dir.file("m.safetensors"));
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);  // data starts 8-byte aligned
  auto header = nlohmann::json::parse(bytes.substr(8, n));
  EXPECT_EQ(header["__metadata__"]["format"], "pt");
  EXPECT_EQ(header["b"]["dtype"], "F32");
  EXPECT_EQ(header["b"]["shape"], nlohmann::json({3}));
  EXPECT_EQ(header["b"]["data_offsets"], nlohmann::json({0, 12}));
  EXPECT_EQ(header["a"]["dtype"], "I64");
  EXPECT_EQ(header["a"]["data_offsets"], nlohmann::json({12, 20}));
  EXPECT_EQ(bytes.size(), 8 + n + 20);
  float second;
  std::memcpy(&second, bytes.data() + 8 + n + 4, 4);
  EXPECT_EQ(second, 2.0f);
}

TEST(Safetensors, RoundTripsEveryDtypeAndViews) {
  testing::TempDir dir;
  TensorDict t;
  for (auto dtype : {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16, at::kLong, at::kInt,
                     at::kShort, at::kChar, at::kByte, at::kBool}) {
    t.insert(std::string(c10::toString(dtype)), (at::randn({2, 3}) * 10).to(dtype));
  }
  at::Tensor base = at::arange(20, at::kFloat).reshape({4, 5});
  t.insert("transposed_view", base.t());
  t.insert("empty", at::zeros({0}));
  save_safetensors(t, dir.file("m.safetensors"));
  TensorDict back = load_safetensors(dir.file("m.safetensors"));
  ASSERT_EQ(back.size(), t.size());
  size_t i = 0;
  for (const auto& item : t) {
    EXPECT_EQ(back[i].key(), item.key());  // file order
    EXPECT_EQ(back[item.key()].scalar_type(), item.value().scalar_type());
    EXPECT_TRUE(at::equal(back[item.key()], item.value())) << item.key();
    ++i;
  }
}

TEST(Safetensors, RejectsBrokenFiles) {
  testing::TempDir dir;
  TensorDict t;
  t.insert("w", at::ones({100}));
  save_safetensors(t, dir.file("good.safetensors"));
  const std::string good = read_file(dir.file("good.safetensors"));
  auto write = [&](const std::string& name, const std::string& bytes) {
    std::ofstream(dir.file(name), std::ios::binary) << bytes;
    return dir.file(name);
  };
  EXPECT_THROW_WITH(load_safetensors(write("short", "abc")), CheckpointError, "no header length");
  EXPECT_THROW_WITH(load_safetensors(write("cut", good.substr(0, good.size() - 4))),
                    CheckpointError, "tensor 'w' ends at byte 400 of the data, which holds only 396");
  std::string huge = good;
  huge[7] = 0x7f;
  EXPECT_THROW_WITH(load_safetensors(write("huge", huge)), CheckpointError, "exceeds the file");
  std::string garbled = good;
  garbled[9] = '!';
  EXPECT_THROW_WITH(load_safetensors(write("garbled", garbled)), CheckpointError,
                    "malformed safetensors header");
  TensorDict complex;
  complex.insert("c", at::zeros({1}, at::kComplexFloat));
  EXPECT_THROW_WITH(save_safetensors(complex, dir.file("c")), NotSupportedError,
                    "safetensors has no dtype for tensor 'c'");
}

}  // namespace
}  // namespace deepspeed::checkpoint
