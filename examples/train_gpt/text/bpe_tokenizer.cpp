// Byte-level BPE as GPT-2 defines it: bytes are spelled in a printable 256-letter alphabet,
// text is split into words (pretokenizer.h), and each word's bytes are merged pairwise by rank.
// Works on token ids throughout, so merging never builds strings; words are cached.
#include "bpe_tokenizer.h"

#include <algorithm>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "file_util.h"
#include "pretokenizer.h"
#include "unicode_classes.h"

#ifndef DS_GPT2_BPE_DIR
#error "DS_GPT2_BPE_DIR must name the directory holding encoder.json and vocab.bpe"
#endif

namespace deepspeed::examples {
namespace {

// The word cache is a plain map; past this many entries (unusual input such as random bytes)
// it is emptied rather than allowed to grow without bound. Austen has ~15k distinct words.
constexpr size_t kMaxCachedWords = size_t{1} << 20;
constexpr char kEotText[] = "<|endoftext|>";

// GPT-2 spells byte b as code point b when b is printable in Latin-1 ('!'..'~', U+00A1..U+00AC,
// U+00AE..U+00FF) and as U+0100 + k for the k-th remaining byte otherwise. So vocab files stay
// readable text with no whitespace or control characters inside tokens.
struct ByteAlphabet {
  int byte_of[256 + 68];  // code point -> byte, -1 where the code point is not a letter of it

  ByteAlphabet() {
    std::fill(std::begin(byte_of), std::end(byte_of), -1);
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      byte_of[printable ? b : 256 + extra++] = b;
    }
  }

  // Raw bytes of a token spelled in the alphabet; false if a character is not in it.
  bool to_bytes(std::string_view spelled, std::string* out) const {
    out->clear();
    for (size_t pos = 0; pos < spelled.size();) {
      char32_t cp;
      pos += detail::decode_utf8(spelled, pos, &cp);
      if (cp >= std::size(byte_of) || byte_of[cp] < 0) return false;
      out->push_back(static_cast<char>(byte_of[cp]));
    }
    return true;
  }
};

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

}  // namespace

struct BpeTokenizer::WordCache {
  std::mutex mutex;
  std::unordered_map<std::string, std::vector<int32_t>> words;
};

BpeTokenizer::BpeTokenizer() : cache_(std::make_unique<WordCache>()) {}
BpeTokenizer::BpeTokenizer(BpeTokenizer&&) noexcept = default;
BpeTokenizer& BpeTokenizer::operator=(BpeTokenizer&&) noexcept = default;
BpeTokenizer::~BpeTokenizer() = default;

BpeTokenizer BpeTokenizer::from_default_files() {
  const std::string dir = DS_GPT2_BPE_DIR;
  return from_files(dir + "/encoder.json", dir + "/vocab.bpe");
}

BpeTokenizer BpeTokenizer::from_files(const std::string& encoder_json,
                                      const std::string& vocab_bpe) {
  const std::string encoder_text = read_file(encoder_json);
  const std::string merges_text = read_file(vocab_bpe);
  const ByteAlphabet alphabet;
  BpeTokenizer tok;

  nlohmann::json encoder;
  try {
    encoder = nlohmann::json::parse(encoder_text);
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(encoder_json + ": not valid JSON (" + e.what() +
                             "); expected GPT-2's encoder.json");
  }
  if (!encoder.is_object() || encoder.empty()) {
    throw std::runtime_error(encoder_json + ": expected a JSON object mapping tokens to ids");
  }
  tok.token_bytes_.assign(encoder.size(), std::string());
  std::vector<bool> seen(encoder.size(), false);
  std::unordered_map<std::string, int32_t> id_of_bytes;
  id_of_bytes.reserve(encoder.size());
  std::string bytes;
  for (const auto& [spelled, value] : encoder.items()) {
    if (!value.is_number_integer() || value.get<int64_t>() < 0 ||
        value.get<int64_t>() >= static_cast<int64_t>(encoder.size())) {
      throw std::runtime_error(encoder_json + ": token \"" + spelled + "\" has id " + value.dump() +
                               "; ids must be 0.." + std::to_string(encoder.size() - 1));
    }
    const auto id = value.get<int32_t>();
    if (seen[id]) {
      throw std::runtime_error(encoder_json + ": id " + std::to_string(id) + " is used twice");
    }
    seen[id] = true;
    if (spelled == kEotText) {
      tok.eot_token_ = id;
      bytes = spelled;  // decodes to its own text, as GPT-2's decoder does
    } else if (!alphabet.to_bytes(spelled, &bytes)) {
      throw std::runtime_error(encoder_json + ": token \"" + spelled +
                               "\" has a character outside GPT-2's byte alphabet");
    }
    if (!id_of_bytes.emplace(bytes, id).second) {
      throw std::runtime_error(encoder_json + ": token \"" + spelled + "\" (id " +
                               std::to_string(id) + ") spells the same bytes as another token");
    }
    tok.token_bytes_[id] = bytes;
  }
  if (tok.eot_token_ < 0) {
    throw std::runtime_error(encoder_json + ": no \"<|endoftext|>\" token");
  }
  for (int b = 0; b < 256; ++b) {
    const auto it = id_of_bytes.find(std::string(1, static_cast<char>(b)));
    if (it == id_of_bytes.end()) {
      throw std::runtime_error(encoder_json + ": no token for byte " + std::to_string(b) +
                               "; a byte-level vocabulary needs all 256");
    }
    tok.byte_token_[b] = it->second;
  }

  // vocab.bpe: "#version: 0.2" then one merge "left right" per line, best (rank 0) first.
  tok.merges_.reserve(encoder.size());
  size_t line_no = 0;
  int32_t rank = 0;
  std::string left_bytes, right_bytes;
  for (size_t pos = 0; pos < merges_text.size();) {
    size_t eol = merges_text.find('\n', pos);
    if (eol == std::string::npos) eol = merges_text.size();
    std::string_view line(merges_text.data() + pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || (line_no == 1 && line.substr(0, 8) == "#version")) continue;
    const auto where = [&] { return vocab_bpe + ":" + std::to_string(line_no) + ": "; };
    const size_t space = line.find(' ');
    if (space == std::string_view::npos || line.find(' ', space + 1) != std::string_view::npos) {
      throw std::runtime_error(where() + "expected two tokens separated by one space, found \"" +
                               std::string(line) + "\"");
    }
    if (!alphabet.to_bytes(line.substr(0, space), &left_bytes) ||
        !alphabet.to_bytes(line.substr(space + 1), &right_bytes)) {
      throw std::runtime_error(where() + "character outside GPT-2's byte alphabet");
    }
    const auto left = id_of_bytes.find(left_bytes);
    const auto right = id_of_bytes.find(right_bytes);
    const auto merged = id_of_bytes.find(left_bytes + right_bytes);
    if (left == id_of_bytes.end() || right == id_of_bytes.end() || merged == id_of_bytes.end()) {
      throw std::runtime_error(where() + "merge \"" + std::string(line) +
                               "\" uses or makes a token missing from " + encoder_json +
                               "; the two files must come from the same vocabulary");
    }
    // First occurrence wins, as in GPT-2 (later duplicates could never be reached anyway).
    tok.merges_.emplace(pair_key(left->second, right->second), Merge{rank++, merged->second});
  }

  Sha256 hasher;
  hasher.update(encoder_text);
  hasher.update(merges_text);
  tok.vocab_sha256_ = hasher.digest();
  return tok;
}

void BpeTokenizer::encode_word(std::string_view word, std::vector<int32_t>* out) const {
  if (word.size() == 1) {
    out->push_back(byte_token_[static_cast<uint8_t>(word[0])]);
    return;
  }
  if (word.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    throw std::length_error("BpeTokenizer::encode: a single word of " +
                            std::to_string(word.size()) + " bytes is too long (limit 2^31-1)");
  }
  // Doubly linked list of symbols plus a min-heap of candidate merges keyed (rank, position).
  // Popping in that order applies GPT-2's rule (lowest rank first, left to right among equal
  // ranks) in O(n log n) instead of GPT-2's O(n^2) rescans: long words such as a run of 10k
  // dashes stay fast. Candidates are not removed when neighbours change; a popped candidate
  // whose ids no longer match the list is stale and skipped.
  struct Symbol {
    int32_t id, prev, next;
  };
  struct Candidate {
    int32_t rank, left, left_id, right_id, result;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : left > o.left;
    }
  };
  const auto n = static_cast<int32_t>(word.size());
  std::vector<Symbol> symbols(n);
  for (int32_t i = 0; i < n; ++i) {
    symbols[i] = {byte_token_[static_cast<uint8_t>(word[i])], i - 1, i + 1 < n ? i + 1 : -1};
  }
  std::vector<Candidate> heap;
  const auto consider = [&](int32_t left) {
    if (left < 0) return;
    const int32_t right = symbols[left].next;
    if (right < 0) return;
    const auto it = merges_.find(pair_key(symbols[left].id, symbols[right].id));
    if (it == merges_.end()) return;
    heap.push_back({it->second.rank, left, symbols[left].id, symbols[right].id, it->second.result});
    std::push_heap(heap.begin(), heap.end(), std::greater<Candidate>());
  };
  for (int32_t i = 0; i + 1 < n; ++i) consider(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<Candidate>());
    const Candidate c = heap.back();
    heap.pop_back();
    Symbol& left = symbols[c.left];
    if (left.id != c.left_id || left.next < 0 || symbols[left.next].id != c.right_id) continue;
    const int32_t right = left.next;
    left.id = c.result;
    left.next = symbols[right].next;
    if (left.next >= 0) symbols[left.next].prev = c.left;
    symbols[right].id = -1;
    consider(left.prev);
    consider(c.left);
  }
  for (int32_t i = 0; i >= 0; i = symbols[i].next) out->push_back(symbols[i].id);
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 4 + 16);  // English averages ~4 bytes per token
  std::vector<int32_t> word_ids;
  std::lock_guard<std::mutex> lock(cache_->mutex);
  auto& words = cache_->words;
  for (size_t pos = 0; pos < text.size();) {
    const size_t end = gpt2_word_end(text, pos);
    std::string key(text.substr(pos, end - pos));
    pos = end;
    const auto it = words.find(key);
    if (it != words.end()) {
      ids.insert(ids.end(), it->second.begin(), it->second.end());
      continue;
    }
    word_ids.clear();
    encode_word(key, &word_ids);
    ids.insert(ids.end(), word_ids.begin(), word_ids.end());
    if (words.size() >= kMaxCachedWords) words.clear();
    words.emplace(std::move(key), word_ids);
  }
  return ids;
}

std::string BpeTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string text;
  for (int32_t id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= token_bytes_.size()) {
      throw std::out_of_range("BpeTokenizer::decode: token id " + std::to_string(id) +
                              " is outside the vocabulary [0, " +
                              std::to_string(token_bytes_.size()) + ")");
    }
    text += token_bytes_[id];
  }
  return text;
}

}  // namespace deepspeed::examples
