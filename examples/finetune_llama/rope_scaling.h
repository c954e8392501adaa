// How a Llama's rotary position embedding is stretched past the context it was trained on:
// Hugging Face's `rope_scaling` (transformers' modeling_rope_utils) and llama.cpp's GGUF form of
// it. Owns reading, checking and writing the parameters and turning them into the rotary
// frequencies; the model applies them (llama_model.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

namespace deepspeed::examples {

struct RopeScaling {
  /// "default" (none), "linear", "dynamic", "llama3", "yarn", "longrope" (Phi-3's) as
  /// transformers names them; "freq_factors" for a GGUF file's per-frequency divisors
  /// (rope_freqs.weight) that are not llama3's own.
  std::string rope_type = "default";
  double factor = 1.0;                              // linear, dynamic, llama3, yarn
  double low_freq_factor = 0.0;                     // llama3
  double high_freq_factor = 0.0;                    // llama3
  int64_t original_max_position_embeddings = 0;     // llama3, longrope, yarn (0: unset)
  std::optional<double> attention_factor;           // yarn; unset: 0.1 ln(factor) + 1
  std::optional<double> beta_fast, beta_slow;       // yarn; unset: 32 and 1
  // yarn (DeepSeek's, gpt-oss'): the attention factor mscale(factor, mscale) /
  // mscale(factor, mscale_all_dim) when both are set; truncate false keeps the correction range
  // unrounded.
  std::optional<double> mscale, mscale_all_dim;
  bool truncate = true;
  std::vector<float> freq_factors;                  // freq_factors: one per frequency
  // longrope: per-frequency divisors within the original context and past it.
  std::vector<double> short_factor, long_factor;

  bool is_default() const { return rope_type == "default"; }

  /// config.json's `rope_scaling` (null or absent: default). The type comes from `rope_type`
  /// or its older spelling `type` ("su" and "yarn" under `type` are Phi-3's old names of
  /// "longrope", as Phi3Config reads them; longrope's original context is the model config's
  /// unless the object gives it). Throws ModelFileError naming `path` and the key for a missing
  /// or mistyped parameter, NotSupportedError for keys the type does not read (dynamic's newer
  /// `original_max_position_embeddings`, longrope's `factor` and `attention_factor`, ... change
  /// their meaning across transformers versions). Yarn reads its later keys as transformers 5
  /// does: `original_max_position_embeddings` (the context the correction range is taken
  /// over; transformers 4.47 ignores it), `mscale`, `mscale_all_dim` and `truncate`. `key` names the object in errors: "rope_scaling", or
  /// "rope_parameters" for transformers 5's form (the same keys, its rope_theta taken out).
  static RopeScaling from_hf_json(const nlohmann::json& rope_scaling, const std::string& path,
                                  const std::string& key = "rope_scaling");
  /// What config.json's `rope_scaling` holds: null for the default; longrope as Phi3Config
  /// 4.47 requires it (`type`, `short_factor`, `long_factor` and nothing else). Throws
  /// NotSupportedError for "freq_factors", which transformers' config cannot express.
  nlohmann::json to_hf_json() const;

  /// llama.cpp's per-frequency divisors for llama3 scaling (what its converter writes to
  /// rope_freqs.weight), in its arithmetic.
  static std::vector<float> llama3_freq_factors(double rope_theta, int64_t head_dim,
                                                double factor, double low_freq_factor,
                                                double high_freq_factor,
                                                int64_t original_max_position_embeddings);
  /// From a GGUF file's rope_freqs.weight: llama3 with Llama 3.1/3.2's parameters (low 1,
  /// high 4, 8,192 original positions, factor the largest divisor) when the divisors are theirs
  /// to 1e-6, else "freq_factors".
  static RopeScaling from_gguf_freq_factors(std::vector<float> factors, double rope_theta,
                                            int64_t head_dim);

  /// Throws ModelFileError naming `source` unless the parameters are usable (factor >= 1, for
  /// llama3 high_freq_factor > low_freq_factor > 0 and original positions > 0, for freq_factors
  /// head_dim / 2 positive divisors, for longrope head_dim / 2 positive short and long factors
  /// and original positions > 0).
  void validate(int64_t head_dim, const std::string& source) const;
};

/// The rotary frequencies transformers' LlamaRotaryEmbedding uses, fp32 [head_dim / 2], and the
/// factor its cos and sin are multiplied by (yarn's and longrope's attention factor; 1
/// otherwise). Each type in transformers 4.47's operation order, so the frequencies are
/// bit-identical to its. Yarn reads the model's context length (`max_position_embeddings`), as
/// transformers 4.47 does; longrope's attention factor is sqrt(1 + ln(s) / ln(original)) for the
/// stretch s = max_position_embeddings / original, as Phi-3's, and its frequencies are the
/// short ones (RotaryFrequencies::for_length picks).
struct RopeFrequencies {
  at::Tensor inv_freq;
  double attention_scaling = 1.0;
};
RopeFrequencies rope_frequencies(const RopeScaling& scaling, double rope_theta, int64_t head_dim,
                                 int64_t max_position_embeddings);

/// The frequencies a model rotates with, kept between forwards: fixed for every type but
/// "dynamic", whose frequencies follow the sequence once it runs past the context (NTK-aware
/// scaling: the base grows with the length), as transformers 4.47's LlamaRotaryEmbedding keeps
/// them: recomputed when a sequence is longer than any before, back to the original ones when a
/// sequence fits the context again after that; and "longrope", whose forward takes the long
/// factors when its sequence runs past the original context and the short ones otherwise (Phi-3's
/// rotary embedding). A KV cache's keys keep the rotation they were computed with, as in
/// transformers (whose Phi-3 generation recomputes its cache once at the switch; generate() does
/// the same).
class RotaryFrequencies {
 public:
  RotaryFrequencies(const RopeScaling& scaling, double rope_theta, int64_t head_dim,
                    int64_t max_position_embeddings);
  /// The frequencies for a forward whose last position is `seq_len` - 1.
  const at::Tensor& for_length(int64_t seq_len);
  double attention_scaling() const { return current_.attention_scaling; }
  /// Whether sequences may run past max_position_embeddings ("dynamic").
  bool extends_context() const { return scaling_.rope_type == "dynamic"; }

 private:
  RopeScaling scaling_;
  double theta_;
  int64_t head_dim_, max_positions_;
  RopeFrequencies original_, current_;
  RopeFrequencies long_;  // longrope past the original context
  int64_t cached_length_;  // transformers' max_seq_len_cached
};

}  // namespace deepspeed::examples
