// BPE for Llama models (see llama_tokenizer.h). Byte-level: GPT-2's byte alphabet maps each byte
// to a printable code point (printable Latin-1 bytes to themselves, the others to U+0100 on), so
// vocabulary strings are UTF-8 text. SentencePiece-style: vocabulary strings are the text itself,
// with "▁" for a space and <0xXX> for a byte. Either way merges combine two vocabulary strings in
// rank order.
#include "llama_tokenizer.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <initializer_list>
#include <optional>

#include "gguf_file.h"
#include "merges_from_scores.h"
#include "pretokenizer.h"
#include "unicode_nfc.h"
#include "util/check.h"

namespace deepspeed::examples {
namespace {

std::string utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// byte -> code point of GPT-2's bytes_to_unicode.
std::vector<uint32_t> byte_alphabet() {
  std::vector<uint32_t> cp(256, 0);
  std::vector<bool> printable(256, false);
  for (int b = 33; b <= 126; ++b) printable[b] = true;
  for (int b = 161; b <= 172; ++b) printable[b] = true;
  for (int b = 174; b <= 255; ++b) printable[b] = true;
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b) cp[b] = printable[b] ? static_cast<uint32_t>(b) : next++;
  return cp;
}

// The raw bytes a vocabulary string spells, or nullopt when it has a code point outside the
// byte alphabet.
std::optional<std::string> alphabet_to_bytes(const std::string& s,
                                             const std::unordered_map<uint32_t, uint8_t>& inv) {
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    uint32_t cp;
    size_t n;
    if (c < 0x80) { cp = c; n = 1; }
    else if ((c >> 5) == 6 && i + 1 < s.size()) { cp = ((c & 0x1F) << 6) | (s[i + 1] & 0x3F); n = 2; }
    else if ((c >> 4) == 14 && i + 2 < s.size()) {
      cp = ((c & 0x0F) << 12) | ((s[i + 1] & 0x3F) << 6) | (s[i + 2] & 0x3F); n = 3;
    } else { return std::nullopt; }
    auto it = inv.find(cp);
    if (it == inv.end()) return std::nullopt;
    out += static_cast<char>(it->second);
    i += n;
  }
  return out;
}

// Whether `s` is UTF-8 as Rust's String::from_utf8 accepts it (no overlong forms, surrogates or
// code points past U+10FFFF): tokenizers' ByteFallback decodes a run of byte tokens only then.
bool is_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n;
    uint32_t cp;
    if (c < 0x80) { ++i; continue; }
    if ((c >> 5) == 6) { n = 2; cp = c & 0x1F; }
    else if ((c >> 4) == 14) { n = 3; cp = c & 0x0F; }
    else if ((c >> 3) == 30) { n = 4; cp = c & 0x07; }
    else { return false; }
    if (i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n;
  }
  return true;
}

// `s` with each ill-formed UTF-8 sequence replaced by one U+FFFD per maximal subpart, as Rust's
// String::from_utf8_lossy does for tokenizers' ByteLevel decoder (and Python's "replace"): a
// generation may stop inside a character, or a model emit bytes that form none.
std::string utf8_lossy(std::string_view s) {
  static const char kReplacement[] = "\xEF\xBF\xBD";
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      out += s[i++];
      continue;
    }
    size_t need = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // the second byte's range; later ones are 80..BF
    if (c >= 0xC2 && c <= 0xDF) {
      need = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
      need = 2;
      if (c == 0xE0) lo = 0xA0;  // no overlong form
      if (c == 0xED) hi = 0x9F;  // no surrogate
    } else if (c >= 0xF0 && c <= 0xF4) {
      need = 3;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;  // nothing past U+10FFFF
    }
    size_t k = 1;
    for (; need > 0 && k <= need && i + k < s.size(); ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if (d < (k == 1 ? lo : 0x80) || d > (k == 1 ? hi : 0xBF)) break;
    }
    if (need > 0 && k == need + 1) {
      out.append(s.substr(i, k));
    } else {
      out += kReplacement;
    }
    i += k;
  }
  return out;
}

// The byte a "<0xXX>" token stands for (hex in either case, as ByteFallback parses it), or -1.
int byte_of_token(const std::string& t) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
  int v = 0;
  for (int k = 3; k < 5; ++k) {
    const char c = t[static_cast<size_t>(k)];
    const int d = c >= '0' && c <= '9'   ? c - '0'
                  : c >= 'a' && c <= 'f' ? c - 'a' + 10
                  : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                         : -1;
    if (d < 0) return -1;
    v = v * 16 + d;
  }
  return v;
}

std::string byte_token_name(int b) {
  char name[8];
  std::snprintf(name, sizeof(name), "<0x%02X>", b);
  return name;
}

std::vector<std::string> string_array(const nlohmann::json& arr) {
  std::vector<std::string> out;
  out.reserve(arr.size());
  for (const auto& v : arr) out.push_back(v.get<std::string>());
  return out;
}

// tokenizer.json's merges: "left right" strings (one space, as tokenizers requires) or, since
// tokenizers 0.20, [left, right] pairs.
std::vector<std::pair<std::string, std::string>> parse_merges(const nlohmann::json& arr,
                                                              const std::string& source) {
  std::vector<std::pair<std::string, std::string>> out;
  out.reserve(arr.size());
  for (const auto& m : arr) {
    if (m.is_array() && m.size() == 2) {
      out.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
      continue;
    }
    const std::string s = m.is_string() ? m.get<std::string>() : std::string();
    const size_t sp = s.find(' ');
    DS_CHECK(sp != std::string::npos && s.find(' ', sp + 1) == std::string::npos, ModelFileError,
             source, ": merge ", out.size(), " (", m.dump(), ") is not two tokens separated by "
             "one space");
    out.emplace_back(s.substr(0, sp), s.substr(sp + 1));
  }
  return out;
}

// The special token ids tokenizer.ggml.{bos,eos,unknown,padding}_token_id name (-1 where
// absent), each checked to lie inside the vocabulary.
struct GgufTokenIds {
  int64_t bos = -1, eos = -1, unk = -1, pad = -1;
};

GgufTokenIds gguf_token_ids(const GgufFile& f, size_t vocab, const std::string& source) {
  const auto id = [&](const char* key) {
    const int64_t v = f.has(key) ? f.get_int(key) : int64_t{-1};
    DS_CHECK(v < static_cast<int64_t>(vocab), ModelFileError, source, ": ", key, " is ", v,
             ", outside the vocabulary of ", vocab);
    return v;
  };
  return {id("tokenizer.ggml.bos_token_id"), id("tokenizer.ggml.eos_token_id"),
          id("tokenizer.ggml.unknown_token_id"), id("tokenizer.ggml.padding_token_id")};
}

// The tokens whose tokenizer.ggml.token_type is one of `types` (3 control, 4 user-defined).
std::vector<int64_t> gguf_tokens_of_type(const GgufFile& f, size_t vocab,
                                         const std::string& source,
                                         std::initializer_list<int64_t> types) {
  std::vector<int64_t> out;
  if (!f.has("tokenizer.ggml.token_type")) return out;
  const auto& all = f.get_array("tokenizer.ggml.token_type");
  DS_CHECK(all.size() == vocab, ModelFileError, source, ": tokenizer.ggml.token_type has ",
           all.size(), " entries, tokenizer.ggml.tokens ", vocab);
  for (size_t i = 0; i < all.size(); ++i) {
    const int64_t type = all[i].get<int64_t>();
    if (std::find(types.begin(), types.end(), type) != types.end()) {
      out.push_back(static_cast<int64_t>(i));
    }
  }
  return out;
}

}  // namespace

void LlamaTokenizer::build(const std::vector<std::string>& tokens, const MergeList& merges,
                           const std::vector<int64_t>& special_ids, const std::string& source) {
  token_strings_ = tokens;
  token_bytes_.resize(tokens.size());
  byte_value_.assign(tokens.size(), -1);
  is_special_.assign(tokens.size(), false);
  for (int64_t id : special_ids) is_special_.at(static_cast<size_t>(id)) = true;
  special_ids_ = special_ids;
  for (size_t i = 0; i < tokens.size(); ++i) vocab_.emplace(tokens[i], static_cast<int64_t>(i));
  for (int b = 0; b < 256; ++b) {
    auto it = vocab_.find(byte_token_name(b));
    byte_fallback_token_[b] = it != vocab_.end() ? it->second : -1;
  }
  if (metaspace_) {
    for (size_t i = 0; i < tokens.size(); ++i) {
      const int b = is_special_[i] ? -1 : byte_of_token(tokens[i]);
      byte_value_[i] = static_cast<int16_t>(b);
      if (b >= 0 || is_special_[i]) {
        token_bytes_[i] = b >= 0 ? std::string(1, static_cast<char>(b)) : tokens[i];
        continue;
      }
      // The decoder's Replace: each replacement reads as a space.
      std::string text;
      const std::string& r = metaspace_->replacement;
      for (size_t p = 0; p < tokens[i].size();) {
        if (tokens[i].compare(p, r.size(), r) == 0) { text += ' '; p += r.size(); }
        else { text += tokens[i][p++]; }
      }
      token_bytes_[i] = std::move(text);
    }
  } else {
    const auto cps = byte_alphabet();
    std::unordered_map<uint32_t, uint8_t> inv;
    for (int b = 0; b < 256; ++b) inv[cps[b]] = static_cast<uint8_t>(b);
    for (size_t i = 0; i < tokens.size(); ++i) {
      auto bytes = is_special_[i] ? std::nullopt : alphabet_to_bytes(tokens[i], inv);
      token_bytes_[i] = bytes ? *bytes : tokens[i];
      if (bytes) bytes_vocab_.emplace(*bytes, static_cast<int64_t>(i));
    }
    // A vocabulary may lack some bytes (SmolLM2's has no token for most control bytes); such a
    // byte becomes the unknown token, as in transformers' BPE.
    int n_bytes = 0;
    for (int b = 0; b < 256; ++b) {
      auto it = vocab_.find(utf8(cps[b]));
      byte_token_[b] = it != vocab_.end() ? it->second : -1;
      n_bytes += it != vocab_.end();
    }
    DS_CHECK(n_bytes >= 128, ModelFileError, source, ": only ", n_bytes,
             " of the 256 bytes have a token of their own; not a byte-level BPE vocabulary");
  }
  merge_list_ = merges;
  for (size_t r = 0; r < merges.size(); ++r) {
    const auto& [left, right] = merges[r];
    auto l = vocab_.find(left), rr = vocab_.find(right), res = vocab_.find(left + right);
    DS_CHECK(l != vocab_.end() && rr != vocab_.end() && res != vocab_.end(), ModelFileError, source,
             ": merge ", r, " ('", left, " ", right,
             "') combines tokens missing from the vocabulary");
    // A pair listed twice keeps its last rank, as tokenizers' merge map does.
    merges_.insert_or_assign(
        merge_key(l->second, rr->second),
        std::make_pair(static_cast<int32_t>(r), static_cast<int32_t>(res->second)));
  }
  // Longest first, so that a special token containing another is matched whole.
  std::sort(special_ids_.begin(), special_ids_.end(), [&](int64_t a, int64_t b) {
    return token_bytes_[a].size() > token_bytes_[b].size();
  });
}

// transformers' GGUF loader for a "qwen2" model (GGUFQwen2Converter, then Qwen2TokenizerFast):
// NFC, Qwen2's split pattern, no byte fallback, no template; the special tokens are the three it
// names (its class's unknown, EOS and padding token is one of them), not the file's control
// tokens.
LlamaTokenizer LlamaTokenizer::qwen2_from_gguf(const GgufFile& f,
                                               const std::vector<std::string>& tokens,
                                               const MergeList& merges) {
  const std::string source = "GGUF file " + f.path();
  DS_CHECK(f.get_string("tokenizer.ggml.model") == "gpt2", ModelFileError, source,
           ": tokenizer.ggml.model is '", f.get_string("tokenizer.ggml.model"), "'; a 'qwen2' "
           "model's tokenizer is byte-level BPE ('gpt2')");
  DS_CHECK(nfc_available(), NotSupportedError, source, ": a 'qwen2' tokenizer normalizes to NFC, "
           "which needs ICU; this build was made without it (install libicu-dev and reconfigure)");
  LlamaTokenizer t;
  t.split_ = WordSplit::kQwen2;
  t.nfc_ = true;
  std::vector<int64_t> special;
  for (const char* name : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) {
    const auto it = std::find(tokens.begin(), tokens.end(), name);
    DS_CHECK(it != tokens.end(), ModelFileError, source, ": a 'qwen2' vocabulary lacks ", name,
             " (transformers would add it past the embedding's rows)");
    special.push_back(it - tokens.begin());
  }
  const GgufTokenIds ids = gguf_token_ids(f, tokens.size(), source);
  t.bos_id_ = ids.bos;
  t.eos_id_ = ids.eos;
  t.pad_id_ = ids.pad;
  t.build(tokens, merges, special, source);
  return t;
}

// A byte-level vocabulary as llama.cpp reads it, for the models transformers' GGUF loader reads
// otherwise or not at all: `split`, no normalizer, the control and user-defined tokens special,
// BOS prepended only with tokenizer.ggml.add_bos_token.
LlamaTokenizer LlamaTokenizer::llama_cpp_byte_level(const GgufFile& f,
                                                    const std::vector<std::string>& tokens,
                                                    const MergeList& merges, WordSplit split) {
  const std::string source = "GGUF file " + f.path();
  LlamaTokenizer t;
  t.split_ = split;
  const GgufTokenIds ids = gguf_token_ids(f, tokens.size(), source);
  t.bos_id_ = ids.bos;
  t.eos_id_ = ids.eos;
  t.pad_id_ = ids.pad;
  t.build(tokens, merges, gguf_tokens_of_type(f, tokens.size(), source, {3, 4}), source);
  const auto& meta = f.metadata();
  if (t.bos_id_ >= 0 && meta.contains("tokenizer.ggml.add_bos_token") &&
      meta["tokenizer.ggml.add_bos_token"] == true) {
    t.prefix_ = {t.bos_id_};
  }
  return t;
}

LlamaTokenizer LlamaTokenizer::from_gguf(const GgufFile& f) {
  const std::string model = f.get_string("tokenizer.ggml.model");
  DS_CHECK(model == "gpt2" || model == "llama", ModelFileError, "GGUF file ", f.path(),
           ": tokenizer.ggml.model is '", model, "'; finetune_llama reads byte-level BPE ('gpt2') "
           "and SentencePiece BPE ('llama') tokenizers");
  const std::string source = "GGUF file " + f.path();
  const auto tokens = string_array(f.get_array("tokenizer.ggml.tokens"));
  LlamaTokenizer t;
  MergeList merges;
  if (f.has("tokenizer.ggml.merges")) {
    merges = parse_merges(f.get_array("tokenizer.ggml.merges"), source);
  } else {
    DS_CHECK(model == "llama", ModelFileError, source, ": tokenizer.ggml.merges is missing");
    std::vector<double> scores;
    for (const auto& v : f.get_array("tokenizer.ggml.scores")) {
      DS_CHECK(v.is_number(), ModelFileError, source, ": tokenizer.ggml.scores holds ",
               v.type_name(), "; expected numbers");
      scores.push_back(v.get<double>());
    }
    DS_CHECK(scores.size() == tokens.size(), ModelFileError, source, ": tokenizer.ggml.scores has ",
             scores.size(), " entries, tokenizer.ggml.tokens ", tokens.size());
    merges = merges_from_scores(tokens, scores);
  }
  if (model == "llama") {
    // transformers' GGUF loader: the "legacy" normalizer, prepending unless
    // tokenizer.ggml.add_space_prefix is false.
    Metaspace m;
    m.form = Metaspace::Form::kNormalizer;
    const auto& meta = f.metadata();
    const bool add_prefix = !meta.contains("tokenizer.ggml.add_space_prefix") ||
                            meta["tokenizer.ggml.add_space_prefix"] != false;
    m.prepend = add_prefix ? Metaspace::Prepend::kAlways : Metaspace::Prepend::kNever;
    t.metaspace_ = m;
  }
  const std::string arch =
      f.has("general.architecture") ? f.get_string("general.architecture") : std::string();
  // transformers reads Qwen3's and the Qwen MoEs' with its Qwen2 converter too.
  if (arch == "qwen2" || arch == "qwen3" || arch == "qwen2moe" || arch == "qwen3moe") {
    return qwen2_from_gguf(f, tokens, merges);
  }
  const std::string pre = f.has("tokenizer.ggml.pre") ? f.get_string("tokenizer.ggml.pre") : "";
  // Phi-4-mini's (transformers' GGUF loader reads any 'phi3' vocabulary as SentencePiece):
  // GPT-4o's split pattern ("llama4" is split the same); Phi-3's and Phi-3.5's are SentencePiece
  // BPE ("llama"). Its tokenizer.json adds no BOS.
  if (arch == "phi3" && model == "gpt2") {
    DS_CHECK(pre == "gpt-4o" || pre == "llama4", NotSupportedError, source,
             ": tokenizer.ggml.pre is '", pre, "' on a 'phi3' model with a byte-level "
             "vocabulary; finetune_llama reads Phi-4-mini's 'gpt-4o' (GPT-4o's split pattern)");
    return llama_cpp_byte_level(f, tokens, merges, WordSplit::kO200k);
  }
  // DeepSeek-V3's (transformers reads no DeepSeek GGUF): its three splits.
  if (arch == "deepseek2" && model == "gpt2") {
    DS_CHECK(pre == "deepseek-v3", NotSupportedError, source, ": tokenizer.ggml.pre is '", pre,
             "' on a 'deepseek2' model; finetune_llama reads DeepSeek-V3's 'deepseek-v3' split "
             "(not DeepSeek-V2's 'deepseek-llm' yet)");
    return llama_cpp_byte_level(f, tokens, merges, WordSplit::kDeepSeekV3);
  }
  // transformers' GGUF loader builds its BPE with fuse_unk and byte_fallback.
  t.fuse_unk_ = true;
  t.byte_fallback_ = true;
  std::vector<int64_t> special = gguf_tokens_of_type(f, tokens.size(), source, {3});
  const GgufTokenIds ids = gguf_token_ids(f, tokens.size(), source);
  t.bos_id_ = ids.bos;
  t.eos_id_ = ids.eos;
  t.unk_id_ = ids.unk;
  t.pad_id_ = ids.pad;
  // transformers' tokenizer also adds the unknown and BOS tokens it is given as special tokens
  // (not EOS: the GGUF loader passes the BOS token's text for both).
  for (int64_t sid : {t.unk_id_, t.bos_id_}) {
    if (sid >= 0 && std::find(special.begin(), special.end(), sid) == special.end()) {
      special.push_back(sid);
    }
  }
  t.build(tokens, merges, special, source);
  if (t.bos_id_ >= 0) t.prefix_ = {t.bos_id_};
  return t;
}

LlamaTokenizer LlamaTokenizer::from_hf_json(const std::string& path) {
  std::ifstream in(path);
  DS_CHECK(in.good(), ModelFileError, "tokenizer file ", path, " is missing");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    DS_CHECK(false, ModelFileError, path, ": not valid JSON (", e.what(), ")");
  }
  const auto& model = j.at("model");
  DS_CHECK(model.value("type", "") == "BPE", ModelFileError, path, ": model.type is '",
           model.value("type", ""), "'; expected BPE");
  const nlohmann::json none;
  nlohmann::json normalizer = j.contains("normalizer") ? j["normalizer"] : none;
  // NFC (Qwen2's normalizer) goes first, whatever splits the text after it.
  const bool nfc = normalizer.is_object() && normalizer.value("type", "") == "NFC";
  if (nfc) {
    DS_CHECK(nfc_available(), NotSupportedError, path, ": the NFC normalizer needs ICU, which "
             "this build was made without (install libicu-dev and reconfigure)");
    normalizer = none;
  }
  const auto metaspace =
      Metaspace::from_hf_json(normalizer, j.contains("pre_tokenizer") ? j["pre_tokenizer"] : none,
                              path);
  const WordSplit split =
      metaspace ? WordSplit::kGpt2 : word_split_from_hf_json(j["pre_tokenizer"], path);
  const auto& vocab = model.at("vocab");
  std::vector<std::string> tokens(vocab.size());
  for (const auto& [tok, id] : vocab.items()) {
    const auto i = id.get<int64_t>();
    DS_CHECK(i >= 0 && i < static_cast<int64_t>(tokens.size()), ModelFileError, path,
             ": model.vocab id ", i, " of '", tok, "' is not below the vocabulary size ", tokens.size());
    tokens[static_cast<size_t>(i)] = tok;
  }
  std::vector<int64_t> special;
  for (const auto& a : j.value("added_tokens", nlohmann::json::array())) {
    const auto id = a.at("id").get<int64_t>();
    if (id >= static_cast<int64_t>(tokens.size())) tokens.resize(static_cast<size_t>(id) + 1);
    tokens[static_cast<size_t>(id)] = a.at("content").get<std::string>();
    special.push_back(id);
  }
  const auto merges = parse_merges(model.at("merges"), "tokenizer file " + path);
  LlamaTokenizer t;
  t.metaspace_ = metaspace;
  t.split_ = split;
  t.nfc_ = nfc;
  t.ignore_merges_ = model.value("ignore_merges", false);
  const auto flag = [&](const char* key) {
    return model.contains(key) && model[key].is_boolean() && model[key].get<bool>();
  };
  t.byte_fallback_ = flag("byte_fallback");
  t.fuse_unk_ = flag("fuse_unk");
  for (const char* key : {"dropout", "continuing_subword_prefix", "end_of_word_suffix"}) {
    DS_CHECK(!model.contains(key) || model[key].is_null() || model[key] == "", NotSupportedError,
             path, ": model.", key, " is ", model[key].dump(), "; finetune_llama supports none");
  }
  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    auto it = std::find(tokens.begin(), tokens.end(), model["unk_token"].get<std::string>());
    if (it != tokens.end()) t.unk_id_ = it - tokens.begin();
  }
  t.build(tokens, merges, special, "tokenizer file " + path);
  // The template's special tokens around the text; a ByteLevel step only adjusts offsets.
  const auto& post = j["post_processor"];
  auto read_post = [&](const nlohmann::json& step) {
    const std::string type = step.value("type", "");
    if (type == "ByteLevel") return;
    DS_CHECK(type == "TemplateProcessing", NotSupportedError, path, ": post_processor ",
             step.dump().substr(0, 200), " is not supported; finetune_llama reads "
             "TemplateProcessing and ByteLevel");
    bool after = false;
    for (const auto& item : step.at("single")) {
      if (item.contains("Sequence")) { after = true; continue; }
      const std::string name = item.at("SpecialToken").at("id").get<std::string>();
      for (const auto& id : step.at("special_tokens").at(name).at("ids"))
        (after ? t.suffix_ : t.prefix_).push_back(id.get<int64_t>());
    }
  };
  if (post.is_object() && post.value("type", "") == "Sequence") {
    for (const auto& step : post.at("processors")) read_post(step);
  } else if (!post.is_null()) {
    read_post(post);
  }
  if (!t.prefix_.empty()) t.bos_id_ = t.prefix_.front();
  return t;
}

void LlamaTokenizer::initial_symbols(std::string_view word, std::vector<int64_t>* ids) const {
  // tokenizers' BPE: a pending unknown run is written when the next known symbol comes (or at
  // the end), so byte-fallback tokens arriving meanwhile go before it.
  bool unk_pending = false;
  const auto symbol = [&](std::string_view s, int64_t id) {
    if (id >= 0) {
      if (unk_pending) ids->push_back(unk_id_);
      unk_pending = false;
      ids->push_back(id);
      return;
    }
    if (byte_fallback_) {
      bool all = true;
      for (unsigned char c : s) all = all && byte_fallback_token_[c] >= 0;
      if (all) {
        for (unsigned char c : s) ids->push_back(byte_fallback_token_[c]);
        return;
      }
    }
    if (unk_id_ < 0) return;  // no unknown token: the symbol is dropped
    if (unk_pending && !fuse_unk_) ids->push_back(unk_id_);
    unk_pending = true;
  };
  if (metaspace_) {
    for (size_t p = 0; p < word.size();) {
      const auto c = static_cast<unsigned char>(word[p]);
      size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
      n = std::min(n, word.size() - p);
      const std::string_view ch = word.substr(p, n);
      auto it = vocab_.find(std::string(ch));
      symbol(ch, it != vocab_.end() ? it->second : -1);
      p += n;
    }
  } else {
    static const std::vector<uint32_t> cps = byte_alphabet();
    for (unsigned char c : word) {
      if (byte_token_[c] >= 0) symbol({}, byte_token_[c]);
      else symbol(utf8(cps[c]), -1);  // ByteLevel made the byte its alphabet's code point
    }
  }
  if (unk_pending) ids->push_back(unk_id_);
}

int64_t LlamaTokenizer::whole_word_id(std::string_view word) const {
  const auto& table = metaspace_ ? vocab_ : bytes_vocab_;
  auto it = table.find(std::string(word));
  return it != table.end() ? it->second : -1;
}

void LlamaTokenizer::encode_word(std::string_view word, std::vector<int64_t>* out) const {
  constexpr size_t kLongestCached = 256;
  const bool cacheable = word.size() <= kLongestCached;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_->mutex);
    auto it = cache_->ids.find(std::string(word));
    if (it != cache_->ids.end()) {
      out->insert(out->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  if (ignore_merges_) {
    if (const int64_t id = whole_word_id(word); id >= 0) {
      out->push_back(id);
      return;
    }
  }
  std::vector<int64_t> parts;
  parts.reserve(word.size());
  initial_symbols(word, &parts);
  merge_word(merges_, &parts);
  out->insert(out->end(), parts.begin(), parts.end());
  if (!cacheable) return;
  std::lock_guard<std::mutex> lock(cache_->mutex);
  if (cache_->ids.size() < (1u << 20)) cache_->ids.emplace(std::string(word), std::move(parts));
}

std::vector<int64_t> LlamaTokenizer::encode(std::string_view text) const {
  std::vector<int64_t> out(prefix_);
  size_t start = 0, pos = 0;
  auto flush = [&](size_t end) {
    std::string normalized;
    std::string_view piece = text.substr(start, end - start);
    if (nfc_) {
      normalized = to_nfc(piece, "the tokenizer's NFC normalizer");
      piece = normalized;
    }
    if (metaspace_) {
      metaspace_->for_each_word(piece, start == 0,
                                [&](const std::string& word) { encode_word(word, &out); });
    } else {
      for_each_word(split_, piece, [&](std::string_view word) { encode_word(word, &out); });
    }
  };
  while (pos < text.size()) {
    int64_t hit = -1;
    for (int64_t id : special_ids_) {
      const std::string& s = token_bytes_[static_cast<size_t>(id)];
      if (s.empty() || s[0] != text[pos]) continue;
      if (!s.empty() && text.compare(pos, s.size(), s) == 0) { hit = id; break; }
    }
    if (hit < 0) { ++pos; continue; }
    flush(pos);
    out.push_back(hit);
    pos += token_bytes_[static_cast<size_t>(hit)].size();
    start = pos;
  }
  flush(text.size());
  out.insert(out.end(), suffix_.begin(), suffix_.end());
  return out;
}

std::string LlamaTokenizer::decode(const std::vector<int64_t>& ids, bool skip_special) const {
  for (int64_t id : ids) {
    DS_CHECK(id >= 0 && id < static_cast<int64_t>(token_bytes_.size()), UsageError, "token id ", id,
             " is outside the vocabulary of ", token_bytes_.size());
  }
  if (metaspace_) return decode_sentencepiece(ids, skip_special);
  std::string s;
  for (int64_t id : ids) {
    if (skip_special && is_special_[static_cast<size_t>(id)]) continue;
    s += token_bytes_[static_cast<size_t>(id)];
  }
  return utf8_lossy(s);
}

std::string LlamaTokenizer::decode_sentencepiece(const std::vector<int64_t>& ids,
                                                 bool skip_special) const {
  std::string s, run;
  size_t run_tokens = 0;
  const auto end_run = [&] {
    if (is_utf8(run)) {
      s += run;
    } else {
      for (size_t k = 0; k < run_tokens; ++k) s += "\xEF\xBF\xBD";  // U+FFFD
    }
    run.clear();
    run_tokens = 0;
  };
  for (int64_t id : ids) {
    const auto i = static_cast<size_t>(id);
    if (skip_special && is_special_[i]) continue;
    if (byte_value_[i] >= 0) {
      run += static_cast<char>(byte_value_[i]);
      ++run_tokens;
      continue;
    }
    end_run();
    s += token_bytes_[i];
  }
  end_run();
  if (metaspace_->strips_leading_space() && !s.empty() && s[0] == ' ') s.erase(0, 1);
  return s;
}

std::string LlamaTokenizer::decode_continuation(const std::vector<int64_t>& prompt,
                                                const std::vector<int64_t>& generated) const {
  std::vector<int64_t> all(prompt);
  all.insert(all.end(), generated.begin(), generated.end());
  const std::string whole = decode(all, true), head = decode(prompt, true);
  if (whole.compare(0, head.size(), head) == 0) return whole.substr(head.size());
  return decode(generated, true);
}

nlohmann::json LlamaTokenizer::to_hf_json() const {
  nlohmann::json vocab = nlohmann::json::object();
  for (size_t i = 0; i < token_strings_.size(); ++i) vocab[token_strings_[i]] = i;
  // "left right" strings read by every tokenizers version; pairs when a token has a space.
  bool spaced = false;
  for (const auto& [l, r] : merge_list_) {
    spaced = spaced || l.find(' ') != std::string::npos || r.find(' ') != std::string::npos;
  }
  nlohmann::json merges = nlohmann::json::array();
  for (const auto& [l, r] : merge_list_) {
    merges.push_back(spaced ? nlohmann::json::array({l, r}) : nlohmann::json(l + " " + r));
  }
  nlohmann::json added = nlohmann::json::array();
  std::vector<int64_t> specials = special_ids_;
  std::sort(specials.begin(), specials.end());
  for (int64_t id : specials) {
    added.push_back({{"id", id}, {"content", token_strings_[static_cast<size_t>(id)]},
                     {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                     {"normalized", false}, {"special", true}});
  }
  nlohmann::json single = nlohmann::json::array(), special_tokens = nlohmann::json::object();
  auto add_special = [&](int64_t id) {
    const std::string& name = token_strings_[static_cast<size_t>(id)];
    single.push_back({{"SpecialToken", {{"id", name}, {"type_id", 0}}}});
    special_tokens[name] = {{"id", name}, {"ids", {id}}, {"tokens", {name}}};
  };
  for (int64_t id : prefix_) add_special(id);
  single.push_back({{"Sequence", {{"id", "A"}, {"type_id", 0}}}});
  for (int64_t id : suffix_) add_special(id);
  return {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", nfc_        ? nlohmann::json{{"type", "NFC"}}
                     : metaspace_ ? metaspace_->normalizer_json()
                                  : nlohmann::json(nullptr)},
      {"pre_tokenizer",
       metaspace_ ? metaspace_->pre_tokenizer_json() : word_split_to_hf_json(split_)},
      {"post_processor", {{"type", "TemplateProcessing"}, {"single", single}, {"pair", single},
                          {"special_tokens", special_tokens}}},
      {"decoder", metaspace_ ? metaspace_->decoder_json()
                             : nlohmann::json{{"type", "ByteLevel"}, {"add_prefix_space", true},
                                              {"trim_offsets", true}, {"use_regex", true}}},
      {"model", {{"type", "BPE"}, {"dropout", nullptr},
                 {"unk_token", unk_id_ >= 0 ? nlohmann::json(token_strings_[static_cast<size_t>(unk_id_)])
                                            : nlohmann::json(nullptr)},
                 {"continuing_subword_prefix", nullptr}, {"end_of_word_suffix", nullptr},
                 {"fuse_unk", fuse_unk_}, {"byte_fallback", byte_fallback_},
                 {"ignore_merges", ignore_merges_}, {"vocab", vocab}, {"merges", merges}}},
  };
}

nlohmann::json LlamaTokenizer::hf_tokenizer_config(int64_t model_max_length) const {
  nlohmann::json c = {{"tokenizer_class", "PreTrainedTokenizerFast"},
                      {"model_max_length", model_max_length},
                      {"clean_up_tokenization_spaces", false}};
  const auto name = [&](int64_t id) { return token_strings_[static_cast<size_t>(id)]; };
  if (bos_id_ >= 0) c["bos_token"] = name(bos_id_);
  if (eos_id_ >= 0) c["eos_token"] = name(eos_id_);
  if (unk_id_ >= 0) c["unk_token"] = name(unk_id_);
  if (pad_id_ >= 0) c["pad_token"] = name(pad_id_);
  return c;
}

}  // namespace deepspeed::examples
