// rope_scaling: config.json's forms read, checked and written back; llama.cpp's GGUF forms
// (rope.scaling.type / .factor, the older rope.scale_linear, rope_freqs.weight) read into the same
// scaling; each type's frequencies against their definition. rope_scaling_parity_test holds them
// against transformers bit for bit.
#include "rope_scaling.h"

#include <cmath>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "gguf_file.h"
#include "gguf_test_writer.h"
#include "llama_config.h"
#include "support/expect_throw.h"
#include "support/temp_dir.h"

namespace deepspeed::examples {
namespace {

using nlohmann::json;
using testing::GgufTestWriter;
using testing::TempDir;

torch::Tensor default_frequencies(double theta, int64_t head_dim) {
  return rope_frequencies(RopeScaling{}, theta, head_dim, 2048).inv_freq;
}

TEST(RopeScaling, ReadsEachTypeAndWritesItBack) {
  const auto llama3 = RopeScaling::from_hf_json(
      json{{"rope_type", "llama3"}, {"factor", 32.0}, {"low_freq_factor", 1.0},
           {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}},
      "config.json");
  EXPECT_EQ(llama3.rope_type, "llama3");
  EXPECT_EQ(llama3.factor, 32.0);
  EXPECT_EQ(llama3.original_max_position_embeddings, 8192);
  const auto back = RopeScaling::from_hf_json(llama3.to_hf_json(), "again");
  EXPECT_EQ(back.high_freq_factor, 4.0);
  EXPECT_EQ(back.to_hf_json(), llama3.to_hf_json());

  // The older spelling, as Llama 2 era configs have it; "type" wins as in transformers.
  const auto linear =
      RopeScaling::from_hf_json(json{{"type", "linear"}, {"rope_type", "x"}, {"factor", 2}}, "c");
  EXPECT_EQ(linear.rope_type, "linear");
  EXPECT_EQ(linear.factor, 2.0);

  const auto yarn = RopeScaling::from_hf_json(
      json{{"rope_type", "yarn"}, {"factor", 4.0}, {"beta_fast", 16.0}}, "c");
  EXPECT_EQ(yarn.beta_fast, 16.0);
  EXPECT_FALSE(yarn.beta_slow.has_value());
  EXPECT_EQ(yarn.to_hf_json().count("beta_slow"), 0u);

  EXPECT_TRUE(RopeScaling::from_hf_json(nullptr, "c").is_default());
  EXPECT_TRUE(RopeScaling{}.to_hf_json().is_null());
}

TEST(RopeScaling, RefusesWhatItDoesNotImplementByName) {
  EXPECT_THROW_WITH(RopeScaling::from_hf_json(json{{"rope_type", "longrope"}}, "m/config.json"),
                    ModelFileError,
                    "m/config.json: rope_scaling.short_factor is missing (rope_type 'longrope')");
  EXPECT_THROW_WITH(
      RopeScaling::from_hf_json(json{{"rope_type", "dynamic"}, {"factor", 2.0},
                                     {"original_max_position_embeddings", 4096}},
                                "c"),
      NotSupportedError, "rope_scaling.original_max_position_embeddings is not read for rope_type "
                         "'dynamic'");
  EXPECT_THROW_WITH(RopeScaling::from_hf_json(json{{"rope_type", "ntk"}}, "c"), ModelFileError,
                    "'ntk' is unknown");
  EXPECT_THROW_WITH(
      RopeScaling::from_hf_json(json{{"rope_type", "yarn"}, {"factor", 4.0},
                                     {"low_freq_factor", 1.0}},
                                "c"),
      NotSupportedError, "rope_scaling.low_freq_factor is not read for rope_type 'yarn'");
  EXPECT_THROW_WITH(
      RopeScaling::from_hf_json(json{{"rope_type", "yarn"}, {"factor", 4.0},
                                     {"original_max_position_embeddings", 0}},
                                "c"),
      ModelFileError, "rope_scaling.original_max_position_embeddings is 0; expected a positive "
                      "integer");
  EXPECT_THROW_WITH(RopeScaling::from_hf_json(json{{"rope_type", "llama3"}, {"factor", 8.0}}, "c"),
                    ModelFileError, "rope_scaling.low_freq_factor is missing");
  EXPECT_THROW_WITH(RopeScaling::from_hf_json(json{{"rope_type", "linear"}, {"factor", "2"}}, "c"),
                    ModelFileError, "rope_scaling.factor is string; expected a number");
  RopeScaling shrink;
  shrink.rope_type = "linear";
  shrink.factor = 0.5;
  EXPECT_THROW_WITH(shrink.validate(64, "m"), ModelFileError, "factor is 0.5; expected a number >= 1");
}

TEST(RopeScaling, FrequenciesFollowEachDefinition) {
  const auto base = default_frequencies(500000.0, 64);
  RopeScaling linear;
  linear.rope_type = "linear";
  linear.factor = 2.5;
  EXPECT_TRUE(torch::equal(rope_frequencies(linear, 500000.0, 64, 2048).inv_freq, base / 2.5));

  RopeScaling llama3;
  llama3.rope_type = "llama3";
  llama3.factor = 32;
  llama3.low_freq_factor = 1;
  llama3.high_freq_factor = 4;
  llama3.original_max_position_embeddings = 8192;
  const auto f = rope_frequencies(llama3, 500000.0, 64, 131072).inv_freq;
  for (int64_t i = 0; i < 32; ++i) {
    const double wavelen = 2 * M_PI / base[i].item<double>();
    if (wavelen < 8192 / 4.0) {
      EXPECT_EQ(f[i].item<float>(), base[i].item<float>()) << i;  // short: kept
    } else if (wavelen > 8192) {
      EXPECT_EQ(f[i].item<float>(), base[i].item<float>() / 32) << i;  // long: divided
    } else {
      EXPECT_LT(f[i].item<float>(), base[i].item<float>()) << i;  // blended between the two
      EXPECT_GT(f[i].item<float>(), base[i].item<float>() / 32) << i;
    }
  }

  RopeScaling yarn;
  yarn.rope_type = "yarn";
  yarn.factor = 4;
  const auto y = rope_frequencies(yarn, 10000.0, 16, 1024);
  EXPECT_DOUBLE_EQ(y.attention_scaling, 0.1 * std::log(4.0) + 1);
  const auto plain = default_frequencies(10000.0, 16);
  // Dimension 0 turns more than beta_fast times over the context: extrapolated (kept); the last
  // turns less than beta_slow times: interpolated (divided by the factor).
  EXPECT_FLOAT_EQ(y.inv_freq[0].item<float>(), plain[0].item<float>());
  EXPECT_FLOAT_EQ(y.inv_freq[7].item<float>(), plain[7].item<float>() / 4);
  yarn.attention_factor = 1.25;
  EXPECT_EQ(rope_frequencies(yarn, 10000.0, 16, 1024).attention_scaling, 1.25);
}

// Yarn's later keys, as transformers 5 reads them: the correction range over
// original_max_position_embeddings instead of the model's context, DeepSeek's mscale ratio as
// the attention factor, and truncate false leaving the range unrounded. All written back.
TEST(RopeScaling, YarnReadsOriginalContextMscaleAndTruncate) {
  const auto yarn = RopeScaling::from_hf_json(
      json{{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 256},
           {"mscale", 1.0}, {"mscale_all_dim", 0.8}, {"truncate", false}},
      "c");
  EXPECT_EQ(yarn.original_max_position_embeddings, 256);
  EXPECT_FALSE(yarn.truncate);
  EXPECT_EQ(RopeScaling::from_hf_json(yarn.to_hf_json(), "again").to_hf_json(), yarn.to_hf_json());
  RopeScaling over_original = yarn;
  over_original.truncate = true;
  RopeScaling over_context = over_original;
  over_context.original_max_position_embeddings = 0;
  EXPECT_TRUE(torch::equal(rope_frequencies(over_original, 10000.0, 64, 4096).inv_freq,
                           rope_frequencies(over_context, 10000.0, 64, 256).inv_freq));
  EXPECT_FALSE(torch::equal(rope_frequencies(over_original, 10000.0, 64, 4096).inv_freq,
                            rope_frequencies(over_context, 10000.0, 64, 4096).inv_freq));
  EXPECT_FALSE(torch::equal(rope_frequencies(yarn, 10000.0, 64, 4096).inv_freq,
                            rope_frequencies(over_original, 10000.0, 64, 4096).inv_freq));
  const double ln4 = std::log(4.0);
  EXPECT_DOUBLE_EQ(rope_frequencies(yarn, 10000.0, 64, 4096).attention_scaling,
                   (0.1 * ln4 + 1) / (0.1 * 0.8 * ln4 + 1));
  EXPECT_THROW_WITH(RopeScaling::from_hf_json(json{{"rope_type", "yarn"}, {"factor", 4.0},
                                                   {"truncate", "no"}},
                                              "c"),
                    ModelFileError, "rope_scaling.truncate is string; expected true or false");
}

// Dynamic NTK scaling: the original frequencies within the context; past it the base grows
// with the longest sequence seen; back to the original ones once a sequence fits again.
TEST(RopeScaling, DynamicFrequenciesFollowTheLongestSequenceAndReset) {
  RopeScaling dynamic;
  dynamic.rope_type = "dynamic";
  dynamic.factor = 2;
  RotaryFrequencies rope(dynamic, 10000.0, 16, 128);
  EXPECT_TRUE(rope.extends_context());
  const auto original = default_frequencies(10000.0, 16);
  EXPECT_TRUE(torch::equal(rope.for_length(100), original));
  const auto at_300 = rope.for_length(300).clone();
  // base' = base * (2 * 300 / 128 - 1)^(16 / 14): every frequency but the first is lower.
  const double grown = 10000.0 * std::pow(2.0 * 300 / 128 - 1, 16.0 / 14);
  EXPECT_FLOAT_EQ(at_300[1].item<float>(), static_cast<float>(1 / std::pow(grown, 2.0 / 16)));
  EXPECT_EQ(at_300[0].item<float>(), 1.0f);
  EXPECT_TRUE(torch::equal(rope.for_length(200), at_300));  // shorter, still past the context
  EXPECT_TRUE(torch::equal(rope.for_length(100), original));  // fits again
  EXPECT_FALSE(RotaryFrequencies(RopeScaling{}, 10000.0, 16, 128).extends_context());
}

TEST(RopeScaling, GgufFreqFactorsOfLlama3BecomeItsParameters) {
  // What llama.cpp's converter writes for Llama 3.2 (factor 32, theta 500000, head size 64).
  auto factors = RopeScaling::llama3_freq_factors(500000.0, 64, 32.0, 1.0, 4.0, 8192);
  ASSERT_EQ(factors.size(), 32u);
  EXPECT_EQ(factors.front(), 1.0f);
  EXPECT_EQ(factors.back(), 32.0f);
  const auto s = RopeScaling::from_gguf_freq_factors(factors, 500000.0, 64);
  EXPECT_EQ(s.rope_type, "llama3");
  EXPECT_EQ(s.factor, 32.0);
  EXPECT_EQ(s.to_hf_json()["original_max_position_embeddings"], 8192);
  // llama.cpp divides by the factors; transformers' formula gives the same frequencies to 1e-6.
  const auto by_division = default_frequencies(500000.0, 64) / torch::tensor(factors);
  EXPECT_TRUE(torch::allclose(rope_frequencies(s, 500000.0, 64, 131072).inv_freq, by_division,
                              1e-6, 0));

  // Other divisors are used as they are, and cannot be written as a config.json.
  factors[20] *= 1.01f;
  const auto other = RopeScaling::from_gguf_freq_factors(factors, 500000.0, 64);
  EXPECT_EQ(other.rope_type, "freq_factors");
  EXPECT_TRUE(torch::equal(rope_frequencies(other, 500000.0, 64, 2048).inv_freq,
                           default_frequencies(500000.0, 64) / torch::tensor(factors)));
  EXPECT_THROW_WITH(other.to_hf_json(), NotSupportedError, "rope_freqs.weight divisors are not "
                                                           "llama3's");
  EXPECT_THROW_WITH(other.validate(128, "m.gguf"), ModelFileError,
                    "rope_freqs.weight has 32 values; the head size 128 needs 64");
}

// A GGUF file with the metadata LlamaConfig::from_gguf needs (head size 64) and `extra`.
GgufFile gguf_with(const TempDir& dir, const std::function<void(GgufTestWriter&)>& extra) {
  GgufTestWriter w;
  w.kv_str("general.architecture", "llama");
  w.kv_u32("llama.block_count", 1);
  w.kv_u32("llama.embedding_length", 128);
  w.kv_u32("llama.feed_forward_length", 256);
  w.kv_u32("llama.attention.head_count", 2);
  w.kv_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  w.kv_f32("llama.rope.freq_base", 500000.0f);
  w.kv_u32("llama.vocab_size", 4);
  w.tensor("token_embd.weight", {128, 4}, 0, std::vector<uint8_t>(128 * 4 * 4));
  extra(w);
  w.write(dir.file("m.gguf"));
  return GgufFile::open(dir.file("m.gguf"));
}

TEST(RopeScaling, ReadFromGgufMetadataAndTensor) {
  TempDir dir;
  auto linear = LlamaConfig::from_gguf(gguf_with(dir, [](GgufTestWriter& w) {
    w.kv_str("llama.rope.scaling.type", "linear");
    w.kv_f32("llama.rope.scaling.factor", 4.0f);
  }));
  EXPECT_EQ(linear.rope_scaling.rope_type, "linear");
  EXPECT_EQ(linear.rope_scaling.factor, 4.0);
  auto legacy = LlamaConfig::from_gguf(
      gguf_with(dir, [](GgufTestWriter& w) { w.kv_f32("llama.rope.scale_linear", 2.0f); }));
  EXPECT_EQ(legacy.rope_scaling.rope_type, "linear");
  EXPECT_EQ(legacy.rope_scaling.factor, 2.0);
  auto none = LlamaConfig::from_gguf(
      gguf_with(dir, [](GgufTestWriter& w) { w.kv_str("llama.rope.scaling.type", "none"); }));
  EXPECT_TRUE(none.rope_scaling.is_default());

  auto llama3 = LlamaConfig::from_gguf(gguf_with(dir, [](GgufTestWriter& w) {
    const auto f = RopeScaling::llama3_freq_factors(500000.0, 64, 8.0, 1.0, 4.0, 8192);
    std::vector<uint8_t> bytes(f.size() * 4);
    std::memcpy(bytes.data(), f.data(), bytes.size());
    w.tensor("rope_freqs.weight", {f.size()}, 0, bytes);
  }));
  EXPECT_EQ(llama3.rope_scaling.rope_type, "llama3");
  EXPECT_EQ(llama3.rope_scaling.factor, 8.0);
  EXPECT_EQ(llama3.to_hf_json()["rope_scaling"]["rope_type"], "llama3");

  EXPECT_THROW_WITH(LlamaConfig::from_gguf(gguf_with(dir, [](GgufTestWriter& w) {
                      w.kv_str("llama.rope.scaling.type", "yarn");
                      w.kv_f32("llama.rope.scaling.factor", 4.0f);
                    })),
                    NotSupportedError, "metadata 'llama.rope.scaling.type' is 'yarn'");
}

}  // namespace
}  // namespace deepspeed::examples
