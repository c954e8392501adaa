// tokenizer.json's SentencePiece-style steps recognised and written back (see metaspace.h).
#include "metaspace.h"

#include <vector>

#include "gguf_file.h"  // ModelFileError
#include "util/check.h"

namespace deepspeed::examples {
namespace {

bool is_type(const nlohmann::json& j, const char* type) {
  return j.is_object() && j.value("type", "") == type;
}

// Replace(" " -> replacement): a String pattern, as transformers writes it.
bool is_space_replace(const nlohmann::json& j, std::string* replacement) {
  if (!is_type(j, "Replace") || !j.contains("pattern") || !j["pattern"].is_object()) return false;
  const auto& pattern = j["pattern"];
  if (!pattern.contains("String") || pattern["String"] != " " || !j.contains("content") ||
      !j["content"].is_string()) {
    return false;
  }
  *replacement = j["content"].get<std::string>();
  return !replacement->empty();
}

[[noreturn]] void refuse(const std::string& path, const char* what, const nlohmann::json& j) {
  throw NotSupportedError(detail::str_cat(
      path, ": ", what, " is ", j.dump().substr(0, 300),
      "; finetune_llama supports no normalizer (byte-level BPE), the SentencePiece-style "
      "Sequence[Prepend(\"\xE2\x96\x81\"), Replace(\" \", \"\xE2\x96\x81\")] with no "
      "pre-tokenizer, or the Metaspace pre-tokenizer with no normalizer"));
}

Metaspace from_normalizer(const nlohmann::json& n, const std::string& path) {
  Metaspace m;
  m.form = Metaspace::Form::kNormalizer;
  m.prepend = Metaspace::Prepend::kNever;
  std::vector<nlohmann::json> steps;
  if (is_type(n, "Sequence") && n.contains("normalizers") && n["normalizers"].is_array()) {
    for (const auto& s : n["normalizers"]) steps.push_back(s);
  } else {
    steps.push_back(n);
  }
  std::string prepended;
  size_t i = 0;
  if (i < steps.size() && is_type(steps[i], "Prepend") && steps[i].contains("prepend") &&
      steps[i]["prepend"].is_string()) {
    prepended = steps[i++]["prepend"].get<std::string>();
  }
  if (i + 1 != steps.size() || !is_space_replace(steps[i], &m.replacement)) {
    refuse(path, "normalizer", n);
  }
  if (!prepended.empty()) {
    DS_CHECK(prepended == m.replacement, NotSupportedError, path, ": normalizer prepends '",
             prepended, "' but replaces spaces by '", m.replacement,
             "'; finetune_llama reads the SentencePiece form, where both are the same");
    m.prepend = Metaspace::Prepend::kAlways;
  }
  return m;
}

Metaspace from_pre_tokenizer(const nlohmann::json& p, const std::string& path) {
  Metaspace m;
  m.form = Metaspace::Form::kPreTokenizer;
  DS_CHECK(p.contains("replacement") && p["replacement"].is_string() &&
               !p["replacement"].get<std::string>().empty(),
           ModelFileError, path, ": the Metaspace pre-tokenizer has no replacement");
  m.replacement = p["replacement"].get<std::string>();
  m.split = p.value("split", true);
  if (p.contains("prepend_scheme") && p["prepend_scheme"].is_string()) {
    const auto scheme = p["prepend_scheme"].get<std::string>();
    if (scheme == "always") m.prepend = Metaspace::Prepend::kAlways;
    else if (scheme == "first") m.prepend = Metaspace::Prepend::kFirst;
    else if (scheme == "never") m.prepend = Metaspace::Prepend::kNever;
    else DS_CHECK(false, ModelFileError, path, ": Metaspace prepend_scheme '", scheme,
                  "' is none of always, first, never");
  } else {
    // Files from tokenizers before 0.14 say add_prefix_space instead.
    m.prepend = p.value("add_prefix_space", true) ? Metaspace::Prepend::kAlways
                                                  : Metaspace::Prepend::kNever;
  }
  return m;
}

}  // namespace

std::optional<Metaspace> Metaspace::from_hf_json(const nlohmann::json& normalizer,
                                                 const nlohmann::json& pre_tokenizer,
                                                 const std::string& path) {
  const bool has_normalizer = !normalizer.is_null();
  if (is_type(pre_tokenizer, "Metaspace")) {
    if (has_normalizer) refuse(path, "normalizer (before a Metaspace pre-tokenizer)", normalizer);
    return from_pre_tokenizer(pre_tokenizer, path);
  }
  if (!has_normalizer) return std::nullopt;
  Metaspace m = from_normalizer(normalizer, path);
  if (!pre_tokenizer.is_null()) refuse(path, "pre_tokenizer (after a normalizer)", pre_tokenizer);
  return m;
}

std::string Metaspace::replace_spaces(std::string_view piece) const {
  std::string s;
  s.reserve(piece.size() + piece.size() / 2);
  for (char c : piece) {
    if (c == ' ') s += replacement;
    else s += c;
  }
  return s;
}

nlohmann::json Metaspace::normalizer_json() const {
  if (form != Form::kNormalizer) return nullptr;
  nlohmann::json steps = nlohmann::json::array();
  if (prepend != Prepend::kNever) steps.push_back({{"type", "Prepend"}, {"prepend", replacement}});
  steps.push_back({{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", replacement}});
  return {{"type", "Sequence"}, {"normalizers", steps}};
}

nlohmann::json Metaspace::pre_tokenizer_json() const {
  if (form != Form::kPreTokenizer) return nullptr;
  const char* scheme = prepend == Prepend::kAlways  ? "always"
                       : prepend == Prepend::kFirst ? "first"
                                                    : "never";
  return {{"type", "Metaspace"}, {"replacement", replacement}, {"prepend_scheme", scheme},
          {"split", split}};
}

nlohmann::json Metaspace::decoder_json() const {
  nlohmann::json steps = {
      {{"type", "Replace"}, {"pattern", {{"String", replacement}}}, {"content", " "}},
      {{"type", "ByteFallback"}},
      {{"type", "Fuse"}},
  };
  if (strips_leading_space()) {
    steps.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
  }
  return {{"type", "Sequence"}, {"decoders", steps}};
}

}  // namespace deepspeed::examples
