// ConfigReader implementation: type checks with the key path, "auto" refusal, unknown keys.
#include "config/json_reader.h"

#include <algorithm>
#include <cmath>

#include "util/check.h"

namespace deepspeed::config_detail {
namespace {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

}  // namespace

bool is_auto(const json& v) { return v.is_string() && v.get_ref<const std::string&>() == "auto"; }

std::string auto_placeholder_reason() {
  return "\"auto\" is a placeholder that the Hugging Face integration fills in before DeepSpeed "
         "reads the config, and this build reads the config as written";
}

std::string auto_placeholder_message(const std::string& expected) {
  return "is \"auto\"; " + auto_placeholder_reason() + ": give " + expected + " here";
}

std::string closest_match(const std::string& key, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = SIZE_MAX;
  for (const auto& c : candidates) {
    size_t d = edit_distance(key, c);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  // Close enough to be a typo: a third of the key's length, at least 2 edits.
  size_t limit = std::max<size_t>(2, key.size() / 3);
  return best_d <= limit ? best : "";
}

std::string show(const json& value) { return value.dump(); }

ConfigReader::ConfigReader(const json* obj, std::string path, std::string source,
                           Strictness strictness, std::vector<std::string>* warnings)
    : obj_(obj), path_(std::move(path)), source_(std::move(source)), strictness_(strictness),
      warnings_(warnings) {}

std::string ConfigReader::where(const std::string& key) const {
  return source_ + ": " + (path_.empty() ? key : path_ + "." + key);
}

void ConfigReader::fail(const std::string& key, const std::string& message) const {
  throw ConfigError(where(key) + " " + message);
}

bool ConfigReader::has(const std::string& key) const {
  return obj_ != nullptr && obj_->contains(key);
}

const json* ConfigReader::lookup(const std::string& key, const char* expected) {
  known_.push_back(key);
  if (obj_ == nullptr) return nullptr;
  auto it = obj_->find(key);
  if (it == obj_->end() || it->is_null()) return nullptr;
  if (is_auto(*it)) fail(key, auto_placeholder_message(expected));
  return &*it;
}

const json* ConfigReader::get_raw(const std::string& key, const char* expected) {
  return lookup(key, expected);
}

bool ConfigReader::take_auto(const std::string& key) {
  known_.push_back(key);
  if (obj_ == nullptr) return false;
  auto it = obj_->find(key);
  return it != obj_->end() && is_auto(*it);
}

const json* ConfigReader::pick_alias(const std::string& key, const std::string& alias,
                                     const char* expected) {
  const json* a = lookup(key, expected);
  const json* b = lookup(alias, expected);
  if (a != nullptr && b != nullptr) {
    fail(key, "and its alias '" + alias + "' are both set; keep one");
  }
  return a != nullptr ? a : b;
}

bool ConfigReader::to_bool(const std::string& key, const json& v) const {
  if (!v.is_boolean()) fail(key, "is " + show(v) + "; expected true or false");
  return v.get<bool>();
}

bool ConfigReader::get_bool(const std::string& key, bool def) {
  const json* v = lookup(key, "true or false");
  return v == nullptr ? def : to_bool(key, *v);
}

bool ConfigReader::get_bool_alias(const std::string& key, const std::string& alias, bool def) {
  const json* v = pick_alias(key, alias, "true or false");
  return v == nullptr ? def : to_bool(key, *v);
}

int64_t ConfigReader::get_int_alias(const std::string& key, const std::string& alias,
                                    int64_t def) {
  const json* v = pick_alias(key, alias, "an integer");
  return v == nullptr ? def : to_int(key, *v, 0);
}

int64_t ConfigReader::get_int(const std::string& key, int64_t def, std::optional<int64_t> min) {
  auto v = get_opt_int(key, min);
  return v.value_or(def);
}

int64_t ConfigReader::to_int(const std::string& key, const json& v,
                             std::optional<int64_t> min) const {
  int64_t out = 0;
  if (v.is_number_integer()) {
    out = v.get<int64_t>();
  } else if (v.is_number_float()) {
    // 5e8 is a float in JSON; DeepSpeed accepts it for element counts when it is integral.
    double d = v.get<double>();
    if (!std::isfinite(d) || std::floor(d) != d || std::fabs(d) > 9.2e18) {
      fail(key, "is " + show(v) + "; expected an integer");
    }
    out = static_cast<int64_t>(d);
  } else {
    fail(key, "is " + show(v) + "; expected an integer");
  }
  if (min && out < *min) {
    fail(key, "is " + std::to_string(out) + "; expected an integer >= " + std::to_string(*min));
  }
  return out;
}

std::optional<int64_t> ConfigReader::get_opt_int(const std::string& key,
                                                 std::optional<int64_t> min) {
  const json* v = lookup(key, "an integer");
  if (v == nullptr) return std::nullopt;
  return to_int(key, *v, min);
}

double ConfigReader::get_double(const std::string& key, double def) {
  const json* v = lookup(key, "a number");
  if (v == nullptr) return def;
  if (!v->is_number()) fail(key, "is " + show(*v) + "; expected a number");
  double d = v->get<double>();
  if (!std::isfinite(d)) fail(key, "is " + show(*v) + "; expected a finite number");
  return d;
}

std::string ConfigReader::get_string(const std::string& key, const std::string& def) {
  return get_opt_string(key).value_or(def);
}

std::optional<std::string> ConfigReader::get_opt_string(const std::string& key) {
  const json* v = lookup(key, "a string");
  if (v == nullptr) return std::nullopt;
  if (!v->is_string()) fail(key, "is " + show(*v) + "; expected a string");
  return v->get<std::string>();
}

std::vector<std::string> ConfigReader::get_string_list(const std::string& key) {
  const json* v = lookup(key, "a list of strings");
  std::vector<std::string> out;
  if (v == nullptr) return out;
  if (!v->is_array()) fail(key, "is " + show(*v) + "; expected a list of strings");
  for (const auto& e : *v) {
    if (!e.is_string()) fail(key, "contains " + show(e) + "; expected a list of strings");
    out.push_back(e.get<std::string>());
  }
  return out;
}

std::vector<int64_t> ConfigReader::get_int_list(const std::string& key,
                                                std::optional<int64_t> min) {
  const json* v = lookup(key, "a list of integers");
  std::vector<int64_t> out;
  if (v == nullptr) return out;
  if (!v->is_array()) fail(key, "is " + show(*v) + "; expected a list of integers");
  for (const auto& e : *v) out.push_back(to_int(key, e, min));
  return out;
}

ConfigReader ConfigReader::section(const std::string& key, Strictness strictness) {
  const json* v = lookup(key, "an object");
  if (v != nullptr && !v->is_object()) fail(key, "is " + show(*v) + "; expected an object");
  std::string sub = path_.empty() ? key : path_ + "." + key;
  return ConfigReader(v, sub, source_, strictness, warnings_);
}

void ConfigReader::mark_all_known() {
  if (obj_ == nullptr) return;
  for (auto it = obj_->begin(); it != obj_->end(); ++it) known_.push_back(it.key());
}

void ConfigReader::finish() {
  if (obj_ == nullptr) return;
  for (auto it = obj_->begin(); it != obj_->end(); ++it) {
    const std::string& key = it.key();
    if (std::find(known_.begin(), known_.end(), key) != known_.end()) continue;
    std::string hint = closest_match(key, known_);
    std::string msg = where(key) + " is not a known key";
    if (!hint.empty()) msg += "; did you mean '" + hint + "'?";
    if (strictness_ == Strictness::kStrict) {
      throw ConfigError(msg + " (DeepSpeed rejects unknown keys in this section)");
    }
    warnings_->push_back(msg + "; it is ignored");
  }
}

}  // namespace deepspeed::config_detail
