// Rotary frequencies and their scaling (see rope_scaling.h). The tensor arithmetic follows
// transformers' modeling_rope_utils operation by operation, Python's `a / t` included (that is
// t.reciprocal() * a), so that every frequency is the same float as transformers computes.
#include "rope_scaling.h"

#include <algorithm>
#include <cmath>
#include <set>

#include <ATen/ATen.h>

#include "gguf_file.h"  // ModelFileError
#include "util/check.h"

namespace deepspeed::examples {
namespace {

constexpr double kPi = 3.14159265358979323846;

// Python's `scalar / tensor`.
at::Tensor rdiv(double a, const at::Tensor& t) { return t.reciprocal() * a; }

// transformers' default: 1 / theta^(2i / d), the exponent's numerator an integer range made float.
at::Tensor default_inv_freq(double theta, int64_t head_dim) {
  const auto exponent =
      at::arange(0, head_dim, 2, at::kLong).to(at::kFloat) / static_cast<double>(head_dim);
  return rdiv(1.0, at::pow(theta, exponent));
}

// `where`: the file and the object read ("config.json: rope_scaling").
double json_number(const nlohmann::json& rs, const char* key, const std::string& where) {
  DS_CHECK(rs.contains(key) && !rs.at(key).is_null(), ModelFileError, where, ".", key,
           " is missing (rope_type '", rs.value("rope_type", rs.value("type", "")), "')");
  DS_CHECK(rs.at(key).is_number(), ModelFileError, where, ".", key, " is ",
           rs.at(key).type_name(), "; expected a number");
  return rs.at(key).get<double>();
}

std::optional<double> optional_number(const nlohmann::json& rs, const char* key,
                                      const std::string& where) {
  if (!rs.contains(key) || rs.at(key).is_null()) return std::nullopt;
  return json_number(rs, key, where);
}

// A list of numbers (longrope's factors).
std::vector<double> json_numbers(const nlohmann::json& rs, const char* key,
                                 const std::string& where) {
  DS_CHECK(rs.contains(key) && !rs.at(key).is_null(), ModelFileError, where, ".", key,
           " is missing (rope_type 'longrope')");
  const auto& list = rs.at(key);
  DS_CHECK(list.is_array(), ModelFileError, where, ".", key, " is ", list.type_name(),
           "; expected a list of numbers");
  std::vector<double> out;
  for (const auto& x : list) {
    DS_CHECK(x.is_number(), ModelFileError, where, ".", key, " holds ", x.dump(),
             "; expected a list of numbers");
    out.push_back(x.get<double>());
  }
  return out;
}

// Phi-3's longrope: 1 / (factors * theta^(2i / d)), the factors an fp32 tensor.
at::Tensor longrope_inv_freq(const std::vector<double>& factors, double theta,
                             int64_t head_dim) {
  const at::Tensor ext = at::tensor(factors, at::TensorOptions().dtype(at::kDouble)).to(at::kFloat);
  const auto exponent =
      at::arange(0, head_dim, 2, at::kLong).to(at::kFloat) / static_cast<double>(head_dim);
  return rdiv(1.0, ext * at::pow(theta, exponent));
}

at::Tensor llama3_inv_freq(const RopeScaling& s, double theta, int64_t head_dim) {
  const at::Tensor inv_freq = default_inv_freq(theta, head_dim);
  const double old = static_cast<double>(s.original_max_position_embeddings);
  const double low_wavelen = old / s.low_freq_factor;
  const double high_wavelen = old / s.high_freq_factor;
  const at::Tensor wavelen = rdiv(2 * kPi, inv_freq);
  // Long wavelengths are divided by the factor, short ones kept, the band between blended.
  at::Tensor scaled = at::where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq);
  const at::Tensor smooth =
      (rdiv(old, wavelen) - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  const at::Tensor smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled;
  const at::Tensor medium = (wavelen < high_wavelen).logical_not() *
                            (wavelen > low_wavelen).logical_not();
  return at::where(medium, smoothed, scaled);
}

// `max_positions`: the context the correction range is taken over (transformers 5 takes the
// original context when the scaling names it).
at::Tensor yarn_inv_freq(const RopeScaling& s, double theta, int64_t head_dim,
                         int64_t max_positions) {
  const auto dim = static_cast<double>(head_dim);
  const at::Tensor pos_freqs =
      at::pow(theta, at::arange(0, head_dim, 2, at::kLong).to(at::kFloat) / dim);
  const at::Tensor extrapolation = rdiv(1.0, pos_freqs);
  const at::Tensor interpolation = rdiv(1.0, pos_freqs * s.factor);
  // The dimensions whose wavelength turns beta_fast .. beta_slow times over the context.
  const double beta_fast = s.beta_fast.value_or(0) != 0 ? *s.beta_fast : 32;
  const double beta_slow = s.beta_slow.value_or(0) != 0 ? *s.beta_slow : 1;
  auto correction_dim = [&](double rotations) {
    return dim * std::log(static_cast<double>(max_positions) / (rotations * 2 * kPi)) /
           (2 * std::log(theta));
  };
  const double fast = correction_dim(beta_fast), slow = correction_dim(beta_slow);
  const double low = std::max(s.truncate ? std::floor(fast) : fast, 0.0);
  double high = std::min(s.truncate ? std::ceil(slow) : slow, dim - 1);
  if (low == high) high += 0.001;
  const at::Tensor ramp =
      at::clamp((at::arange(head_dim / 2, at::kFloat) - low) / (high - low), 0, 1);
  const at::Tensor extrapolation_share = 1 - ramp;
  return interpolation * (1 - extrapolation_share) + extrapolation * extrapolation_share;
}

}  // namespace

RopeScaling RopeScaling::from_hf_json(const nlohmann::json& rs, const std::string& path,
                                      const std::string& key) {
  RopeScaling s;
  if (rs.is_null()) return s;
  const std::string where = path + ": " + key;
  DS_CHECK(rs.is_object(), ModelFileError, where, " is ", rs.type_name(),
           "; expected an object or null");
  // transformers' LlamaConfig copies the older `type` over `rope_type`.
  const char* type_key = rs.contains("type") ? "type" : "rope_type";
  DS_CHECK(rs.contains(type_key) && rs.at(type_key).is_string(), ModelFileError, where,
           " has no rope_type string");
  s.rope_type = rs.at(type_key).get<std::string>();
  // Phi3Config's backward compatibility: its older "su" and "yarn" are longrope.
  const bool phi3_alias = std::string(type_key) == "type" && rs.contains("short_factor") &&
                          (s.rope_type == "su" || s.rope_type == "yarn");
  if (phi3_alias) s.rope_type = "longrope";
  std::set<std::string> known = {"type", "rope_type"};
  if (s.rope_type == "default") {
  } else if (s.rope_type == "linear" || s.rope_type == "dynamic") {
    s.factor = json_number(rs, "factor", where);
    known.insert("factor");
  } else if (s.rope_type == "llama3") {
    s.factor = json_number(rs, "factor", where);
    s.low_freq_factor = json_number(rs, "low_freq_factor", where);
    s.high_freq_factor = json_number(rs, "high_freq_factor", where);
    const double original = json_number(rs, "original_max_position_embeddings", where);
    s.original_max_position_embeddings = static_cast<int64_t>(original);
    DS_CHECK(static_cast<double>(s.original_max_position_embeddings) == original, ModelFileError,
             where, ".original_max_position_embeddings is ", original,
             "; expected an integer");
    known.insert({"factor", "low_freq_factor", "high_freq_factor",
                  "original_max_position_embeddings"});
  } else if (s.rope_type == "yarn") {
    s.factor = json_number(rs, "factor", where);
    s.attention_factor = optional_number(rs, "attention_factor", where);
    s.beta_fast = optional_number(rs, "beta_fast", where);
    s.beta_slow = optional_number(rs, "beta_slow", where);
    s.mscale = optional_number(rs, "mscale", where);
    s.mscale_all_dim = optional_number(rs, "mscale_all_dim", where);
    if (rs.contains("truncate") && !rs.at("truncate").is_null()) {
      DS_CHECK(rs.at("truncate").is_boolean(), ModelFileError, where, ".truncate is ",
               rs.at("truncate").type_name(), "; expected true or false");
      s.truncate = rs.at("truncate").get<bool>();
    }
    if (const auto original = optional_number(rs, "original_max_position_embeddings", where)) {
      s.original_max_position_embeddings = static_cast<int64_t>(*original);
      DS_CHECK(static_cast<double>(s.original_max_position_embeddings) == *original &&
                   *original > 0,
               ModelFileError, where, ".original_max_position_embeddings is ", *original,
               "; expected a positive integer");
    }
    known.insert({"factor", "attention_factor", "beta_fast", "beta_slow", "mscale",
                  "mscale_all_dim", "truncate", "original_max_position_embeddings"});
  } else if (s.rope_type == "longrope") {
    s.short_factor = json_numbers(rs, "short_factor", where);
    s.long_factor = json_numbers(rs, "long_factor", where);
    if (rs.contains("original_max_position_embeddings")) {
      const double original = json_number(rs, "original_max_position_embeddings", where);
      s.original_max_position_embeddings = static_cast<int64_t>(original);
      DS_CHECK(static_cast<double>(s.original_max_position_embeddings) == original,
               ModelFileError, where, ".original_max_position_embeddings is ", original,
               "; expected an integer");
    }
    known.insert({"short_factor", "long_factor", "original_max_position_embeddings"});
  } else {
    DS_CHECK(false, ModelFileError, where, ".rope_type '", s.rope_type,
             "' is unknown; expected default, linear, dynamic, llama3, yarn or longrope");
  }
  for (const auto& [name, value] : rs.items()) {
    DS_CHECK(known.count(name) != 0, NotSupportedError, where, ".", name,
             " is not read for rope_type '", s.rope_type, "' (transformers versions differ on "
             "it); remove it or convert the model with a config that leaves it out");
  }
  return s;
}

nlohmann::json RopeScaling::to_hf_json() const {
  if (is_default()) return nullptr;
  DS_CHECK(rope_type != "freq_factors", NotSupportedError, "rope_scaling: the GGUF file's "
           "rope_freqs.weight divisors are not llama3's; transformers' config cannot express them");
  if (rope_type == "longrope") {
    return {{"type", rope_type}, {"short_factor", short_factor}, {"long_factor", long_factor}};
  }
  nlohmann::json j = {{"rope_type", rope_type}, {"factor", factor}};
  if (rope_type == "llama3") {
    j["low_freq_factor"] = low_freq_factor;
    j["high_freq_factor"] = high_freq_factor;
    j["original_max_position_embeddings"] = original_max_position_embeddings;
  }
  if (attention_factor) j["attention_factor"] = *attention_factor;
  if (beta_fast) j["beta_fast"] = *beta_fast;
  if (beta_slow) j["beta_slow"] = *beta_slow;
  if (rope_type == "yarn") {
    if (original_max_position_embeddings > 0) {
      j["original_max_position_embeddings"] = original_max_position_embeddings;
    }
    if (mscale) j["mscale"] = *mscale;
    if (mscale_all_dim) j["mscale_all_dim"] = *mscale_all_dim;
    if (!truncate) j["truncate"] = false;
  }
  return j;
}

std::vector<float> RopeScaling::llama3_freq_factors(double rope_theta, int64_t head_dim,
                                                    double factor, double low_freq_factor,
                                                    double high_freq_factor,
                                                    int64_t original_max_position_embeddings) {
  // llama.cpp's convert_hf_to_gguf: per frequency 1 (short wavelengths), the factor (long ones)
  // or the reciprocal of llama3's blend, in fp32.
  const at::Tensor inv_freq = default_inv_freq(rope_theta, head_dim);
  const auto old = static_cast<double>(original_max_position_embeddings);
  const double low_wavelen = old / low_freq_factor, high_wavelen = old / high_freq_factor;
  std::vector<float> out;
  for (int64_t i = 0; i < inv_freq.numel(); ++i) {
    const at::Tensor wavelen = rdiv(2 * kPi, inv_freq[i]);
    if ((wavelen < high_wavelen).item<bool>()) {
      out.push_back(1.0f);
    } else if ((wavelen > low_wavelen).item<bool>()) {
      out.push_back(static_cast<float>(factor));
    } else {
      const at::Tensor smooth =
          (rdiv(old, wavelen) - low_freq_factor) / (high_freq_factor - low_freq_factor);
      out.push_back(rdiv(1.0, (1 - smooth) / factor + smooth).item<float>());
    }
  }
  return out;
}

RopeScaling RopeScaling::from_gguf_freq_factors(std::vector<float> factors, double rope_theta,
                                                int64_t head_dim) {
  RopeScaling s;
  s.rope_type = "freq_factors";
  if (factors.empty()) return s;
  // Llama 3.1 (factor 8) and 3.2 (factor 32) share the rest of their parameters.
  const double factor = *std::max_element(factors.begin(), factors.end());
  const auto llama3 = llama3_freq_factors(rope_theta, head_dim, factor, 1.0, 4.0, 8192);
  bool same = llama3.size() == factors.size();
  for (size_t i = 0; same && i < factors.size(); ++i) {
    same = std::abs(llama3[i] - factors[i]) <= 1e-6 * std::abs(llama3[i]);
  }
  if (same) {
    s.rope_type = "llama3";
    s.factor = factor;
    s.low_freq_factor = 1.0;
    s.high_freq_factor = 4.0;
    s.original_max_position_embeddings = 8192;
  } else {
    s.freq_factors = std::move(factors);
  }
  return s;
}

void RopeScaling::validate(int64_t head_dim, const std::string& source) const {
  if (is_default()) return;
  DS_CHECK(std::isfinite(factor) && factor >= 1.0, ModelFileError, source,
           ": rope_scaling.factor is ", factor, "; expected a number >= 1");
  if (rope_type == "llama3") {
    DS_CHECK(low_freq_factor > 0 && high_freq_factor > low_freq_factor, ModelFileError, source,
             ": rope_scaling needs high_freq_factor > low_freq_factor > 0 (got ",
             high_freq_factor, " and ", low_freq_factor, ")");
    DS_CHECK(original_max_position_embeddings > 0, ModelFileError, source,
             ": rope_scaling.original_max_position_embeddings is ",
             original_max_position_embeddings, "; expected a positive integer");
  }
  if (rope_type == "longrope") {
    for (const auto* list : {&short_factor, &long_factor}) {
      const char* name = list == &short_factor ? "short_factor" : "long_factor";
      DS_CHECK(static_cast<int64_t>(list->size()) == head_dim / 2, ModelFileError, source,
               ": rope_scaling.", name, " has ", list->size(), " values; rotating ", head_dim,
               " features of each head needs ", head_dim / 2);
      for (double f : *list) {
        DS_CHECK(std::isfinite(f) && f > 0, ModelFileError, source, ": rope_scaling.", name,
                 " holds ", f, "; expected positive divisors");
      }
    }
    DS_CHECK(original_max_position_embeddings > 0, ModelFileError, source,
             ": longrope needs original_max_position_embeddings > 0 (got ",
             original_max_position_embeddings, ")");
  }
  if (rope_type == "freq_factors") {
    DS_CHECK(static_cast<int64_t>(freq_factors.size()) == head_dim / 2, ModelFileError, source,
             ": rope_freqs.weight has ", freq_factors.size(), " values; the head size ", head_dim,
             " needs ", head_dim / 2);
    for (float f : freq_factors) {
      DS_CHECK(std::isfinite(f) && f > 0, ModelFileError, source, ": rope_freqs.weight holds ",
               f, "; expected positive divisors");
    }
  }
}

namespace {

// transformers 4.47's _compute_dynamic_ntk_parameters for a sequence of `seq_len` positions past
// the context, in its tensor arithmetic: the length is an int64 tensor there, so the new base is
// an fp32 one.
at::Tensor dynamic_ntk_inv_freq(const RopeScaling& s, double theta, int64_t head_dim,
                                int64_t max_positions, int64_t seq_len) {
  const auto dim = static_cast<double>(head_dim);
  const at::Tensor length = at::scalar_tensor(seq_len, at::kLong);
  const at::Tensor base =
      ((length * s.factor / max_positions) - (s.factor - 1)).pow(dim / (dim - 2)) * theta;
  const at::Tensor exponent = at::arange(0, head_dim, 2, at::kLong).to(at::kFloat) / dim;
  return rdiv(1.0, at::pow(base, exponent));
}

}  // namespace

RotaryFrequencies::RotaryFrequencies(const RopeScaling& scaling, double rope_theta,
                                     int64_t head_dim, int64_t max_position_embeddings)
    : scaling_(scaling), theta_(rope_theta), head_dim_(head_dim),
      max_positions_(max_position_embeddings),
      original_(rope_frequencies(scaling, rope_theta, head_dim, max_position_embeddings)),
      current_(original_), cached_length_(max_position_embeddings) {
  if (scaling.rope_type == "longrope") {
    long_ = original_;
    long_.inv_freq = longrope_inv_freq(scaling.long_factor, rope_theta, head_dim);
  }
}

const at::Tensor& RotaryFrequencies::for_length(int64_t seq_len) {
  if (scaling_.rope_type == "longrope") {
    current_ = seq_len > scaling_.original_max_position_embeddings ? long_ : original_;
    return current_.inv_freq;
  }
  if (!extends_context()) return current_.inv_freq;
  if (seq_len > cached_length_) {  // longer than any before: the base grows
    current_.inv_freq =
        dynamic_ntk_inv_freq(scaling_, theta_, head_dim_, max_positions_, seq_len);
    cached_length_ = seq_len;
  }
  if (seq_len < max_positions_ && cached_length_ > max_positions_) {  // fits again: reset
    current_ = original_;
    cached_length_ = max_positions_;
  }
  return current_.inv_freq;
}

RopeFrequencies rope_frequencies(const RopeScaling& s, double rope_theta, int64_t head_dim,
                                 int64_t max_position_embeddings) {
  RopeFrequencies r;
  if (s.rope_type == "linear") {
    r.inv_freq = default_inv_freq(rope_theta, head_dim) / s.factor;
  } else if (s.rope_type == "llama3") {
    r.inv_freq = llama3_inv_freq(s, rope_theta, head_dim);
  } else if (s.rope_type == "yarn") {
    const int64_t context = s.original_max_position_embeddings > 0
                                ? s.original_max_position_embeddings
                                : max_position_embeddings;
    r.inv_freq = yarn_inv_freq(s, rope_theta, head_dim, context);
    // transformers' get_mscale; DeepSeek's ratio when mscale and mscale_all_dim are both set.
    const auto mscale = [&](double m) {
      return s.factor <= 1 ? 1.0 : 0.1 * m * std::log(s.factor) + 1.0;
    };
    if (s.attention_factor) {
      r.attention_scaling = *s.attention_factor;
    } else if (s.mscale.value_or(0) != 0 && s.mscale_all_dim.value_or(0) != 0) {
      r.attention_scaling = mscale(*s.mscale) / mscale(*s.mscale_all_dim);
    } else {
      r.attention_scaling = mscale(1.0);
    }
  } else if (s.rope_type == "longrope") {
    r.inv_freq = longrope_inv_freq(s.short_factor, rope_theta, head_dim);
    const double original = static_cast<double>(s.original_max_position_embeddings);
    const double stretch = static_cast<double>(max_position_embeddings) / original;
    r.attention_scaling =
        stretch <= 1.0 ? 1.0 : std::sqrt(1 + std::log(stretch) / std::log(original));
  } else if (s.rope_type == "freq_factors") {
    r.inv_freq = default_inv_freq(rope_theta, head_dim) /
                 at::tensor(s.freq_factors, at::TensorOptions().dtype(at::kFloat));
  } else {
    r.inv_freq = default_inv_freq(rope_theta, head_dim);
  }
  return r;
}

}  // namespace deepspeed::examples
