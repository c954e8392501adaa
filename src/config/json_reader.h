// ConfigReader: typed, path-aware access to one JSON object of ds_config.json.
// It knows the key path for error messages, refuses "auto" (Hugging Face's placeholder) unless the
// caller takes it with take_auto(), remembers which keys were read, and at finish() reports the
// rest: an error (with a close match) in strict sections, a warning elsewhere.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "deepspeed/config.h"

namespace deepspeed::config_detail {

/// The closest of `candidates` to `key` by edit distance, or "" when none is close.
std::string closest_match(const std::string& key, const std::vector<std::string>& candidates);

/// Renders a JSON value for messages: strings quoted, numbers as written.
std::string show(const json& value);

/// True for the string "auto", the placeholder Hugging Face's integration replaces with numbers.
bool is_auto(const json& value);

/// The message tail for an "auto" this build cannot resolve: `is "auto"; ...` telling the user
/// that "auto" is filled in by the Hugging Face integration and `expected` is needed instead.
std::string auto_placeholder_message(const std::string& expected);
/// The reason part of that message, for callers that phrase their own.
std::string auto_placeholder_reason();

enum class Strictness { kStrict, kWarnUnknown };

class ConfigReader {
 public:
  /// `obj` may be null (section absent): every getter then returns its default.
  ConfigReader(const json* obj, std::string path, std::string source, Strictness strictness,
               std::vector<std::string>* warnings);

  bool present() const { return obj_ != nullptr; }
  bool has(const std::string& key) const;
  const std::string& path() const { return path_; }

  bool get_bool(const std::string& key, bool def);
  int64_t get_int(const std::string& key, int64_t def, std::optional<int64_t> min = {});
  std::optional<int64_t> get_opt_int(const std::string& key, std::optional<int64_t> min = {});
  double get_double(const std::string& key, double def);
  std::string get_string(const std::string& key, const std::string& def);
  std::optional<std::string> get_opt_string(const std::string& key);
  std::vector<std::string> get_string_list(const std::string& key);
  std::vector<int64_t> get_int_list(const std::string& key, std::optional<int64_t> min = {});
  /// Marks `key` as known and returns the raw value (nullptr if absent or null; "auto" refused).
  const json* get_raw(const std::string& key, const char* expected = "a value");
  /// Marks `key` as known and returns whether its value is "auto"; for the keys whose "auto"
  /// this build resolves (the batch triad, bucket sizes, pipeline.stages).
  bool take_auto(const std::string& key);
  /// A nested object section; a non-object value is an error naming the path.
  ConfigReader section(const std::string& key, Strictness strictness);
  /// Reads `alias` as a second name of `key` (DeepSpeed accepts both); giving both is an error.
  const json* pick_alias(const std::string& key, const std::string& alias,
                         const char* expected = "a value");
  int64_t get_int_alias(const std::string& key, const std::string& alias, int64_t def);
  bool get_bool_alias(const std::string& key, const std::string& alias, bool def);
  /// Marks a key as known without reading it (handled elsewhere).
  void mark_known(const std::string& key) { known_.push_back(key); }
  /// Marks every key of the section as known: a switched-off section whose keys nothing reads.
  void mark_all_known();

  /// Reports keys never read: ConfigError in strict sections, a warning otherwise.
  void finish();

  /// Adds "<source>: <path>.<key> <message>" to the warnings.
  void warn(const std::string& key, const std::string& message) const {
    warnings_->push_back(where(key) + " " + message);
  }

  /// "<source>: <path>.<key>" for messages.
  std::string where(const std::string& key) const;
  [[noreturn]] void fail(const std::string& key, const std::string& message) const;

 private:
  /// The value of `key` (nullptr if absent or null); "auto" is refused naming `expected`.
  const json* lookup(const std::string& key, const char* expected);
  int64_t to_int(const std::string& key, const json& v, std::optional<int64_t> min) const;
  bool to_bool(const std::string& key, const json& v) const;

  const json* obj_;
  std::string path_;
  std::string source_;
  Strictness strictness_;
  std::vector<std::string>* warnings_;
  std::vector<std::string> known_;
};

}  // namespace deepspeed::config_detail
