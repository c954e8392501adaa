// tokenizer.json's pre-tokenizers recognised and written back (see word_split.h).
#include "word_split.h"

#include <utility>

#include "util/check.h"

namespace deepspeed::examples {
namespace {

// As Llama 3's and Qwen2's tokenizer.json spell their Split patterns.
constexpr const char* kLlama3Pattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr const char* kQwen2Pattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
// As GPT-4o's (Phi-4-mini's) and Mistral NeMo's tokenizer.json spell theirs.
constexpr const char* kO200kPattern =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+"
    "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr const char* kTekkenPattern =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+|"
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*|"
    "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
// DeepSeek-V3's three Split patterns, in its tokenizer.json's order.
constexpr const char* kDeepSeekV3Patterns[] = {
    "\\p{N}{1,3}",
    "[\u4E00-\u9FA5\u3040-\u309F\u30A0-\u30FF]+",
    R"re([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+|)re"
    R"re( ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re",
};

// The splits that are a Split(pattern) then ByteLevel without regex, and their patterns.
constexpr std::pair<WordSplit, const char*> kSplitPatterns[] = {
    {WordSplit::kLlama3, kLlama3Pattern},
    {WordSplit::kQwen2, kQwen2Pattern},
    {WordSplit::kO200k, kO200kPattern},
    {WordSplit::kTekken, kTekkenPattern},
};

bool is_type(const nlohmann::json& j, const char* type) {
  return j.is_object() && j.value("type", "") == type;
}

// Split(Regex pattern) isolating its matches.
bool is_isolating_split(const nlohmann::json& j, const std::string& pattern) {
  return is_type(j, "Split") && j.value("behavior", "") == "Isolated" &&
         !j.value("invert", false) && j.contains("pattern") && j["pattern"].is_object() &&
         j["pattern"].value("Regex", "") == pattern;
}

nlohmann::json isolating_split(const char* pattern) {
  return {{"type", "Split"},
          {"pattern", {{"Regex", pattern}}},
          {"behavior", "Isolated"},
          {"invert", false}};
}

bool is_byte_level(const nlohmann::json& j, bool use_regex);

bool is_deepseek_v3(const nlohmann::json& pre) {
  if (!is_type(pre, "Sequence") || !pre.contains("pretokenizers")) return false;
  const auto& list = pre["pretokenizers"];
  if (!list.is_array() || list.size() != 4) return false;
  for (size_t i = 0; i < 3; ++i) {
    if (!is_isolating_split(list[i], kDeepSeekV3Patterns[i])) return false;
  }
  return is_byte_level(list[3], false);
}

// ByteLevel without a prefix space; `use_regex` as wanted (absent reads as true).
bool is_byte_level(const nlohmann::json& j, bool use_regex) {
  return is_type(j, "ByteLevel") && !j.value("add_prefix_space", false) &&
         j.value("use_regex", true) == use_regex;
}

nlohmann::json byte_level(bool use_regex) {
  return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true},
          {"use_regex", use_regex}};
}

}  // namespace

WordSplit word_split_from_hf_json(const nlohmann::json& pre, const std::string& path) {
  if (is_byte_level(pre, true)) return WordSplit::kGpt2;
  if (is_deepseek_v3(pre)) return WordSplit::kDeepSeekV3;
  if (is_type(pre, "Sequence") && pre.contains("pretokenizers") &&
      pre["pretokenizers"].is_array() && pre["pretokenizers"].size() == 2) {
    const auto& first = pre["pretokenizers"][0];
    const auto& second = pre["pretokenizers"][1];
    if (is_type(first, "Digits") && first.value("individual_digits", false) &&
        is_byte_level(second, true)) {
      return WordSplit::kGpt2IndividualDigits;
    }
    if (is_type(first, "Split") && first.value("behavior", "") == "Isolated" &&
        !first.value("invert", false) && is_byte_level(second, false) &&
        first.contains("pattern") && first["pattern"].contains("Regex")) {
      const auto pattern = first["pattern"]["Regex"].get<std::string>();
      for (const auto& [split, known] : kSplitPatterns) {
        if (pattern == known) return split;
      }
    }
  }
  DS_CHECK(false, NotSupportedError, path, ": pre_tokenizer is ", pre.dump().substr(0, 300),
           "; finetune_llama supports ByteLevel without add_prefix_space (GPT-2's pattern), "
           "Digits(individual_digits) + ByteLevel (SmolLM), Llama 3's, Qwen2's, GPT-4o's "
           "(Phi-4-mini) or Mistral Tekken's Split + ByteLevel, and DeepSeek-V3's three Splits "
           "+ ByteLevel");
  return WordSplit::kGpt2;
}

nlohmann::json word_split_to_hf_json(WordSplit split) {
  for (const auto& [known, pattern] : kSplitPatterns) {
    if (split == known) {
      return {{"type", "Sequence"},
              {"pretokenizers", {isolating_split(pattern), byte_level(false)}}};
    }
  }
  if (split == WordSplit::kDeepSeekV3) {
    nlohmann::json list = nlohmann::json::array();
    for (const char* pattern : kDeepSeekV3Patterns) list.push_back(isolating_split(pattern));
    list.push_back(byte_level(false));
    return {{"type", "Sequence"}, {"pretokenizers", list}};
  }
  if (split == WordSplit::kGpt2IndividualDigits) {
    return {{"type", "Sequence"},
            {"pretokenizers", {{{"type", "Digits"}, {"individual_digits", true}},
                               byte_level(true)}}};
  }
  return byte_level(true);
}

}  // namespace deepspeed::examples
