// Byte-pair merging of one word, as Hugging Face tokenizers merges: the adjacent pair with the
// lowest merge rank (the leftmost among equals) becomes its merged token, again and again, until
// no adjacent pair has a merge. A heap of candidate pairs makes it O(n log n), which matters for
// SentencePiece-style tokenizers, whose "word" is a whole run of text between special tokens.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <utility>
#include <vector>

namespace deepspeed::examples {

/// (left id << 32 | right id) -> (rank, merged id).
using MergeTable = std::unordered_map<uint64_t, std::pair<int32_t, int32_t>>;

inline uint64_t merge_key(int64_t left, int64_t right) {
  return (static_cast<uint64_t>(left) << 32) | static_cast<uint64_t>(right);
}

/// Merges `ids` (the word's initial symbols) in place.
void merge_word(const MergeTable& merges, std::vector<int64_t>* ids);

}  // namespace deepspeed::examples
