// Byte-level BPE for Llama models (see llama_tokenizer.h). GPT-2's byte alphabet maps each byte
// to a printable code point (printable Latin-1 bytes to themselves, the others to U+0100 on), so
// vocabulary strings are UTF-8 text; merges combine two vocabulary strings in rank order.
#include "llama_tokenizer.h"

#include <algorithm>
#include <fstream>
#include <limits>
#include <optional>

#include "gguf_file.h"
#include "pretokenizer.h"
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

std::vector<std::string> string_array(const nlohmann::json& arr) {
  std::vector<std::string> out;
  out.reserve(arr.size());
  for (const auto& v : arr) out.push_back(v.get<std::string>());
  return out;
}

}  // namespace

void LlamaTokenizer::build(const std::vector<std::string>& tokens,
                           const std::vector<std::string>& merges,
                           const std::vector<int64_t>& special_ids, const std::string& source) {
  const auto cps = byte_alphabet();
  std::unordered_map<uint32_t, uint8_t> inv;
  for (int b = 0; b < 256; ++b) inv[cps[b]] = static_cast<uint8_t>(b);
  token_strings_ = tokens;
  token_bytes_.resize(tokens.size());
  is_special_.assign(tokens.size(), false);
  for (int64_t id : special_ids) is_special_.at(static_cast<size_t>(id)) = true;
  special_ids_ = special_ids;
  for (size_t i = 0; i < tokens.size(); ++i) {
    vocab_.emplace(tokens[i], static_cast<int64_t>(i));
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
  merge_list_ = merges;
  for (size_t r = 0; r < merges.size(); ++r) {
    const std::string& m = merges[r];
    const size_t sp = m.find(' ', 1);
    DS_CHECK(sp != std::string::npos, ModelFileError, source, ": merge ", r, " ('", m,
             "') is not two tokens separated by a space");
    const std::string left = m.substr(0, sp), right = m.substr(sp + 1);
    auto l = vocab_.find(left), rr = vocab_.find(right), res = vocab_.find(left + right);
    DS_CHECK(l != vocab_.end() && rr != vocab_.end() && res != vocab_.end(), ModelFileError, source,
             ": merge ", r, " ('", m, "') combines tokens missing from the vocabulary");
    const uint64_t key = (static_cast<uint64_t>(l->second) << 32) | static_cast<uint64_t>(rr->second);
    merges_.emplace(key, std::make_pair(static_cast<int32_t>(r), static_cast<int32_t>(res->second)));
  }
  // Longest first, so that a special token containing another is matched whole.
  std::sort(special_ids_.begin(), special_ids_.end(), [&](int64_t a, int64_t b) {
    return token_bytes_[a].size() > token_bytes_[b].size();
  });
}

LlamaTokenizer LlamaTokenizer::from_gguf(const GgufFile& f) {
  const std::string model = f.get_string("tokenizer.ggml.model");
  DS_CHECK(model == "gpt2", ModelFileError, "GGUF file ", f.path(), ": tokenizer.ggml.model is '",
           model, "'; finetune_llama reads byte-level BPE ('gpt2') tokenizers");
  const auto tokens = string_array(f.get_array("tokenizer.ggml.tokens"));
  const auto merges = string_array(f.get_array("tokenizer.ggml.merges"));
  std::vector<int64_t> special;
  if (f.has("tokenizer.ggml.token_type")) {
    const auto& types = f.get_array("tokenizer.ggml.token_type");
    DS_CHECK(types.size() == tokens.size(), ModelFileError, "GGUF file ", f.path(),
             ": tokenizer.ggml.token_type has ", types.size(), " entries, tokenizer.ggml.tokens ",
             tokens.size());
    for (size_t i = 0; i < types.size(); ++i) {
      if (types[i].get<int64_t>() == 3) special.push_back(static_cast<int64_t>(i));  // control
    }
  }
  LlamaTokenizer t;
  const auto id = [&](const char* key) { return f.has(key) ? f.get_int(key) : int64_t{-1}; };
  t.bos_id_ = id("tokenizer.ggml.bos_token_id");
  t.eos_id_ = id("tokenizer.ggml.eos_token_id");
  t.unk_id_ = id("tokenizer.ggml.unknown_token_id");
  t.pad_id_ = id("tokenizer.ggml.padding_token_id");
  for (int64_t sid : {t.bos_id_, t.eos_id_, t.unk_id_, t.pad_id_}) {
    DS_CHECK(sid < static_cast<int64_t>(tokens.size()), ModelFileError, "GGUF file ", f.path(),
             ": special token id ", sid, " is outside the vocabulary of ", tokens.size());
  }
  t.build(tokens, merges, special, "GGUF file " + f.path());
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
  DS_CHECK(!j.contains("normalizer") || j["normalizer"].is_null(), NotSupportedError, path,
           ": normalizer is ", j["normalizer"].dump().substr(0, 200),
           "; finetune_llama's byte-level BPE supports none");
  const WordSplit split = word_split_from_hf_json(j["pre_tokenizer"], path);
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
  std::vector<std::string> merges;
  for (const auto& m : model.at("merges")) {
    merges.push_back(m.is_string() ? m.get<std::string>()
                                   : m.at(0).get<std::string>() + " " + m.at(1).get<std::string>());
  }
  LlamaTokenizer t;
  t.split_ = split;
  t.ignore_merges_ = model.value("ignore_merges", false);
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

void LlamaTokenizer::encode_word(std::string_view word, std::vector<int64_t>* out) const {
  {
    std::lock_guard<std::mutex> lock(cache_->mutex);
    auto it = cache_->ids.find(std::string(word));
    if (it != cache_->ids.end()) {
      out->insert(out->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  if (ignore_merges_) {
    if (auto it = bytes_vocab_.find(std::string(word)); it != bytes_vocab_.end()) {
      out->push_back(it->second);
      return;
    }
  }
  std::vector<int64_t> parts;
  parts.reserve(word.size());
  for (unsigned char c : word) {
    const int64_t id = byte_token_[c];
    if (id >= 0) {
      parts.push_back(id);
    } else if (unk_id_ >= 0 && (parts.empty() || parts.back() != unk_id_)) {
      parts.push_back(unk_id_);  // consecutive unknown bytes fuse into one (fuse_unk)
    }
  }
  // Merge the lowest-ranked adjacent pair (leftmost on ties) until no pair has a merge.
  while (parts.size() > 1) {
    int32_t best_rank = std::numeric_limits<int32_t>::max();
    size_t best = 0;
    int32_t best_id = -1;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      const uint64_t key = (static_cast<uint64_t>(parts[i]) << 32) | static_cast<uint64_t>(parts[i + 1]);
      auto it = merges_.find(key);
      if (it != merges_.end() && it->second.first < best_rank) {
        best_rank = it->second.first;
        best = i;
        best_id = it->second.second;
      }
    }
    if (best_id < 0) break;
    parts[best] = best_id;
    parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(best) + 1);
  }
  out->insert(out->end(), parts.begin(), parts.end());
  std::lock_guard<std::mutex> lock(cache_->mutex);
  if (cache_->ids.size() < (1u << 20)) cache_->ids.emplace(std::string(word), std::move(parts));
}

std::vector<int64_t> LlamaTokenizer::encode(std::string_view text) const {
  std::vector<int64_t> out(prefix_);
  size_t start = 0, pos = 0;
  auto flush = [&](size_t end) {
    for_each_word(split_, text.substr(start, end - start),
                  [&](std::string_view word) { encode_word(word, &out); });
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
  std::string s;
  for (int64_t id : ids) {
    DS_CHECK(id >= 0 && id < static_cast<int64_t>(token_bytes_.size()), UsageError, "token id ", id,
             " is outside the vocabulary of ", token_bytes_.size());
    if (skip_special && is_special_[static_cast<size_t>(id)]) continue;
    s += token_bytes_[static_cast<size_t>(id)];
  }
  return s;
}

nlohmann::json LlamaTokenizer::to_hf_json() const {
  nlohmann::json vocab = nlohmann::json::object();
  for (size_t i = 0; i < token_strings_.size(); ++i) vocab[token_strings_[i]] = i;
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
      {"normalizer", nullptr},
      {"pre_tokenizer", word_split_to_hf_json(split_)},
      {"post_processor", {{"type", "TemplateProcessing"}, {"single", single}, {"pair", single},
                          {"special_tokens", special_tokens}}},
      {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true},
                   {"use_regex", true}}},
      {"model", {{"type", "BPE"}, {"dropout", nullptr},
                 {"unk_token", unk_id_ >= 0 ? nlohmann::json(token_strings_[static_cast<size_t>(unk_id_)])
                                            : nlohmann::json(nullptr)},
                 {"continuing_subword_prefix", nullptr}, {"end_of_word_suffix", nullptr},
                 {"fuse_unk", true}, {"byte_fallback", false}, {"ignore_merges", ignore_merges_},
                 {"vocab", vocab}, {"merges", merge_list_}}},
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
