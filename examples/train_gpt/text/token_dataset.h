// Token ids for train_gpt: tokenizing a corpus, caching the ids on disk, the train/val split,
// and a DistributedSampler-style batch sampler over fixed-length windows. Torch-free; turning
// window indices into tensors is the trainer's job (gather_windows fills plain buffers).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "bpe_tokenizer.h"

namespace deepspeed::examples {

// GPT-2 ids of the whole `text` (no document separators are added). uint16 suffices since the
// vocabulary has fewer than 65536 ids; throws std::runtime_error if a tokenizer's does not.
std::vector<uint16_t> tokenize_corpus(const BpeTokenizer& tokenizer, const std::string& text);

// "<text_path>.gpt2.u16"
std::string token_cache_path(const std::string& text_path);

// The ids of the file `text_path`, from its cache (token_cache_path) when the cache matches the
// file and the tokenizer's vocabulary, otherwise tokenized and written to the cache. Cache
// format (all little-endian; see docs/data.md, "Token cache"):
//   bytes  0..7   magic "DSTOKU16"         8..11  format version (1)
//        12..15   header size (96)        16..23  source size in bytes
//        24..31   number of tokens        32..63  SHA-256 of the source file
//        64..95   BpeTokenizer::vocab_sha256()   96..  the ids, uint16 each
// The cache is written atomically (temp file + rename), so ranks that build it at the same time
// are safe; each renames an identical file. A cache that cannot be written (read-only directory)
// only costs a warning on stderr. *rebuilt (optional) tells whether the text was tokenized.
// Throws std::runtime_error if `text_path` cannot be read.
std::vector<uint16_t> load_or_build_token_cache(const BpeTokenizer& tokenizer,
                                                const std::string& text_path,
                                                bool* rebuilt = nullptr);

struct TokenSplit {
  std::vector<uint16_t> train, val;
};

// The last floor(tokens.size() * val_fraction) ids are validation, the rest training (a
// contiguous cut, so no window straddles both). val_fraction must be in [0, 1).
TokenSplit split_train_val(const std::vector<uint16_t>& tokens, double val_fraction = 0.05);

// Number of non-overlapping windows of seq_len inputs (+1 shifted target each) in n_tokens:
// (n_tokens - 1) / seq_len, or 0 for an empty stream.
int64_t num_windows(size_t n_tokens, int64_t seq_len);

// For each window w in `windows` (row r), writes inputs[r*seq_len + t] = tokens[w*seq_len + t]
// and targets[r*seq_len + t] = tokens[w*seq_len + t + 1], t < seq_len. Both buffers must hold
// windows.size() * seq_len values. Throws std::out_of_range for a window past the end.
void gather_windows(const std::vector<uint16_t>& tokens, const std::vector<int64_t>& windows,
                    int64_t seq_len, int64_t* inputs, int64_t* targets);

// Splits an epoch of windows across data-parallel ranks like PyTorch's DistributedSampler
// (shuffle, drop_last) followed by a DataLoader with drop_last, micro-batch by micro-batch.
//
// Each epoch e visits the windows in the order epoch_permutation(num_windows, seed, e). Only
// whole global batches are used: batches_per_epoch() = num_windows / G with
// G = micro_batch * grad_accum_steps * world_size; the tail is dropped so every rank gets the
// same number of micro-batches. Ranks are interleaved as DistributedSampler interleaves them:
// rank r's k-th micro-batch of the epoch (k counts across accumulation steps) is
//     perm[(k * micro_batch + j) * world_size + r],  j = 0 .. micro_batch-1.
// Consequently, in every micro-step the ranks together see exactly the windows that one rank
// with micro_batch * world_size sees, row j*world_size + r of the latter being rank r's row j.
class DistributedBatchSampler {
 public:
  // Throws std::invalid_argument on a non-positive size, a rank outside [0, world_size), or a
  // dataset smaller than one global batch.
  DistributedBatchSampler(int64_t num_windows, int64_t micro_batch, int64_t grad_accum_steps,
                          int64_t world_size, int64_t rank, uint64_t seed);

  // Window indices of this rank's next micro-batch (micro_batch of them). After the epoch's
  // last one, the next call starts the next epoch with a new shuffle.
  std::vector<int64_t> next_micro_batch();

  // Epoch of the micro-batch last returned (0 before the first call).
  int64_t epoch() const { return epoch_; }
  // Global batches (optimizer steps) per epoch; each is grad_accum_steps micro-batches per rank.
  int64_t batches_per_epoch() const { return batches_per_epoch_; }
  int64_t micro_batches_per_epoch() const { return batches_per_epoch_ * grad_accum_steps_; }
  // Micro-batches already returned in the current epoch; with epoch(), the resume position.
  int64_t micro_batch_in_epoch() const { return next_micro_; }
  // Resumes at (epoch, micro_batch_in_epoch), e.g. from a checkpoint; the next call returns
  // that micro-batch. Throws std::invalid_argument when out of range.
  void set_position(int64_t epoch, int64_t micro_batch_in_epoch);

  // The window order of `epoch`: Fisher-Yates over 0..num_windows-1 driven by splitmix64, so the
  // same (seed, epoch) gives the same order on every platform and standard library. Algorithm
  // (for reimplementation, e.g. in Python): state = seed ^ (0x9E3779B97F4A7C15 * (epoch + 1));
  // next() = splitmix64 step; for i = n-1 down to 1: j = uniform(i + 1); swap(p[i], p[j]),
  // where uniform(b) draws r = next() until r >= (2^64 - b) % b and returns r % b.
  static std::vector<int64_t> epoch_permutation(int64_t num_windows, uint64_t seed, int64_t epoch);

 private:
  int64_t num_windows_, micro_batch_, grad_accum_steps_, world_size_, rank_;
  uint64_t seed_;
  int64_t batches_per_epoch_;
  int64_t epoch_ = 0;
  int64_t next_micro_ = 0;
  std::vector<int64_t> permutation_;  // of epoch_
};

}  // namespace deepspeed::examples
