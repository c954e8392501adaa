// "auto" ZeRO sizes from the model's hidden size (see auto_sizes.h for the rule).
#include "config/auto_sizes.h"

#include <map>

#include "config/json_reader.h"
#include "util/check.h"

namespace deepspeed::config_detail {
namespace {

// Hugging Face's formula for each key, as a function of the hidden size h.
int64_t size_for(const std::string& key, int64_t h) {
  if (key == "reduce_bucket_size") return h * h;
  if (key == "stage3_prefetch_bucket_size") return static_cast<int64_t>(0.9 * h * h);
  if (key == "stage3_param_persistence_threshold") return 10 * h;
  DS_INTERNAL_ASSERT(false, "no \"auto\" rule for zero_optimization.", key);
}

const char* formula_for(const std::string& key) {
  if (key == "reduce_bucket_size") return "hidden_size^2";
  if (key == "stage3_prefetch_bucket_size") return "0.9 x hidden_size^2";
  return "10 x hidden_size";
}

int64_t& field_for(ZeroConfig& z, const std::string& key) {
  if (key == "reduce_bucket_size") return z.reduce_bucket_size;
  if (key == "stage3_prefetch_bucket_size") return z.stage3_prefetch_bucket_size;
  DS_INTERNAL_ASSERT(key == "stage3_param_persistence_threshold",
                     "no \"auto\" rule for zero_optimization.", key);
  return z.stage3_param_persistence_threshold;
}

}  // namespace

std::optional<int64_t> hidden_size_of(const std::vector<std::vector<int64_t>>& shapes) {
  std::map<int64_t, int64_t> count;
  for (const auto& s : shapes) {
    if (s.size() != 2) continue;
    ++count[s[0]];
    ++count[s[1]];
  }
  std::optional<int64_t> best;
  int64_t best_count = 0;
  for (const auto& [dim, n] : count) {  // ascending dims: ">=" keeps the larger on a tie
    if (n >= best_count) {
      best = dim;
      best_count = n;
    }
  }
  return best;
}

void resolve_auto_sizes(DeepSpeedConfig& c, int64_t hidden_size, const std::string& origin) {
  auto& z = c.zero_optimization;
  // hidden_size^2 must fit in int64.
  constexpr int64_t kMaxHiddenSize = 3037000499;
  DS_CHECK(hidden_size > 0 && hidden_size <= kMaxHiddenSize, ConfigError, c.source,
           ": hidden size ", hidden_size, " (", origin, ") cannot size zero_optimization.",
           z.auto_sizes.empty() ? "" : z.auto_sizes[0], "; expected 1 to ", kMaxHiddenSize);
  for (const auto& key : z.auto_sizes) {
    const int64_t value = size_for(key, hidden_size);
    field_for(z, key) = value;
    c.notes.push_back(c.source + ": zero_optimization." + key + ": \"auto\" resolved to " +
                      std::to_string(value) + " = " + formula_for(key) + " with hidden_size " +
                      std::to_string(hidden_size) + " (" + origin +
                      "), as the Hugging Face integration fills it");
  }
  z.auto_sizes.clear();
}

void resolve_auto_sizes_from_model(DeepSpeedConfig& c,
                                   const std::vector<std::vector<int64_t>>& param_shapes) {
  auto& z = c.zero_optimization;
  if (z.auto_sizes.empty()) return;
  const auto hidden = hidden_size_of(param_shapes);
  if (!hidden) {
    throw ConfigError(c.source + ": zero_optimization." + z.auto_sizes[0] + " " +
                      auto_placeholder_message("an integer") +
                      " (it is derived from the model's hidden size, and this model has no 2-D "
                      "parameter to read it from)");
  }
  resolve_auto_sizes(c, *hidden, "the most common dimension of the model's 2-D parameters");
}

std::string unresolved_auto_size(const std::string& key) {
  return std::string(formula_for(key)) + " (set from the model at initialize)";
}

}  // namespace deepspeed::config_detail
