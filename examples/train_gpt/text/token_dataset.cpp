// Tokenized corpus on disk and in memory, and the data-parallel window sampler. The cache is a
// flat uint16 array behind a fixed header so it can also be read by numpy (offset 96).
#include "token_dataset.h"

#include <iostream>
#include <stdexcept>

#include "file_util.h"
#include "sha256.h"

namespace deepspeed::examples {
namespace {

constexpr char kCacheMagic[8] = {'D', 'S', 'T', 'O', 'K', 'U', '1', '6'};
constexpr uint32_t kCacheVersion = 1;
constexpr size_t kCacheHeaderBytes = 96;

void put_le(std::string* out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((value >> (8 * i)) & 0xFF));
}

uint64_t get_le(const std::string& in, size_t offset, int bytes) {
  uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) {
    value |= uint64_t{static_cast<unsigned char>(in[offset + i])} << (8 * i);
  }
  return value;
}

std::string cache_header(uint64_t source_bytes, uint64_t num_tokens, const Sha256Digest& source_sha,
                         const Sha256Digest& vocab_sha) {
  std::string h(kCacheMagic, sizeof(kCacheMagic));
  put_le(&h, kCacheVersion, 4);
  put_le(&h, kCacheHeaderBytes, 4);
  put_le(&h, source_bytes, 8);
  put_le(&h, num_tokens, 8);
  h.append(reinterpret_cast<const char*>(source_sha.data()), source_sha.size());
  h.append(reinterpret_cast<const char*>(vocab_sha.data()), vocab_sha.size());
  return h;
}

// The ids of a cache file whose header matches the source and vocabulary, or false (missing,
// stale, truncated or foreign file: the caller rebuilds it).
bool try_load_cache(const std::string& cache_path, uint64_t source_bytes,
                    const Sha256Digest& source_sha, const Sha256Digest& vocab_sha,
                    std::vector<uint16_t>* tokens) {
  if (!file_exists(cache_path)) return false;
  std::string bytes;
  try {
    bytes = read_file(cache_path);
  } catch (const std::runtime_error&) {
    return false;
  }
  if (bytes.size() < kCacheHeaderBytes) return false;
  const uint64_t n = get_le(bytes, 24, 8);
  const std::string expected = cache_header(source_bytes, n, source_sha, vocab_sha);
  if (bytes.compare(0, kCacheHeaderBytes, expected) != 0) return false;
  if ((bytes.size() - kCacheHeaderBytes) / 2 != n || (bytes.size() - kCacheHeaderBytes) % 2 != 0) {
    return false;
  }
  tokens->resize(n);
  for (uint64_t i = 0; i < n; ++i) {
    (*tokens)[i] = static_cast<uint16_t>(get_le(bytes, kCacheHeaderBytes + 2 * i, 2));
  }
  return true;
}

uint64_t splitmix64_next(uint64_t* state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Unbiased draw in [0, bound): reject the lowest (2^64 mod bound) values.
uint64_t uniform_below(uint64_t* state, uint64_t bound) {
  const uint64_t threshold = (0 - bound) % bound;
  for (;;) {
    const uint64_t r = splitmix64_next(state);
    if (r >= threshold) return r % bound;
  }
}

}  // namespace

std::vector<uint16_t> tokenize_corpus(const BpeTokenizer& tokenizer, const std::string& text) {
  if (tokenizer.vocab_size() > 65536) {
    throw std::runtime_error("tokenize_corpus: vocabulary of " +
                             std::to_string(tokenizer.vocab_size()) +
                             " ids does not fit uint16 token storage");
  }
  const std::vector<int32_t> ids = tokenizer.encode(text);
  return std::vector<uint16_t>(ids.begin(), ids.end());
}

std::string token_cache_path(const std::string& text_path) { return text_path + ".gpt2.u16"; }

std::vector<uint16_t> load_or_build_token_cache(const BpeTokenizer& tokenizer,
                                                const std::string& text_path, bool* rebuilt) {
  const std::string text = read_file(text_path);
  const Sha256Digest source_sha = sha256(text);
  const std::string cache_path = token_cache_path(text_path);
  std::vector<uint16_t> tokens;

  if (try_load_cache(cache_path, text.size(), source_sha, tokenizer.vocab_sha256(), &tokens)) {
    if (rebuilt) *rebuilt = false;
    return tokens;
  }

  tokens = tokenize_corpus(tokenizer, text);
  std::string bytes =
      cache_header(text.size(), tokens.size(), source_sha, tokenizer.vocab_sha256());
  bytes.reserve(kCacheHeaderBytes + 2 * tokens.size());
  for (uint16_t t : tokens) put_le(&bytes, t, 2);
  try {
    write_file_atomically(cache_path, bytes);
  } catch (const std::runtime_error& e) {
    std::cerr << "warning: token cache not written (" << e.what()
              << "); the corpus will be tokenized again next run\n";
  }
  if (rebuilt) *rebuilt = true;
  return tokens;
}

TokenSplit split_train_val(const std::vector<uint16_t>& tokens, double val_fraction) {
  if (!(val_fraction >= 0.0 && val_fraction < 1.0)) {
    throw std::invalid_argument("split_train_val: val_fraction " + std::to_string(val_fraction) +
                                " must be in [0, 1)");
  }
  const auto n_val = static_cast<size_t>(static_cast<double>(tokens.size()) * val_fraction);
  const auto cut = tokens.begin() + static_cast<std::ptrdiff_t>(tokens.size() - n_val);
  return TokenSplit{std::vector<uint16_t>(tokens.begin(), cut),
                    std::vector<uint16_t>(cut, tokens.end())};
}

int64_t num_windows(size_t n_tokens, int64_t seq_len) {
  if (seq_len <= 0) throw std::invalid_argument("num_windows: seq_len must be positive");
  return n_tokens == 0 ? 0 : static_cast<int64_t>((n_tokens - 1) / static_cast<size_t>(seq_len));
}

void gather_windows(const std::vector<uint16_t>& tokens, const std::vector<int64_t>& windows,
                    int64_t seq_len, int64_t* inputs, int64_t* targets) {
  const int64_t available = num_windows(tokens.size(), seq_len);
  for (size_t r = 0; r < windows.size(); ++r) {
    const int64_t w = windows[r];
    if (w < 0 || w >= available) {
      throw std::out_of_range("gather_windows: window " + std::to_string(w) + " outside [0, " +
                              std::to_string(available) + ") for " + std::to_string(tokens.size()) +
                              " tokens and seq_len " + std::to_string(seq_len));
    }
    const uint16_t* src = tokens.data() + w * seq_len;
    for (int64_t t = 0; t < seq_len; ++t) {
      inputs[r * seq_len + t] = src[t];
      targets[r * seq_len + t] = src[t + 1];
    }
  }
}

DistributedBatchSampler::DistributedBatchSampler(int64_t num_windows, int64_t micro_batch,
                                                 int64_t grad_accum_steps, int64_t world_size,
                                                 int64_t rank, uint64_t seed)
    : num_windows_(num_windows),
      micro_batch_(micro_batch),
      grad_accum_steps_(grad_accum_steps),
      world_size_(world_size),
      rank_(rank),
      seed_(seed) {
  if (micro_batch <= 0 || grad_accum_steps <= 0 || world_size <= 0 || num_windows < 0) {
    throw std::invalid_argument("DistributedBatchSampler: micro_batch (" +
                                std::to_string(micro_batch) + "), grad_accum_steps (" +
                                std::to_string(grad_accum_steps) + ") and world_size (" +
                                std::to_string(world_size) + ") must be positive, num_windows (" +
                                std::to_string(num_windows) + ") non-negative");
  }
  if (rank < 0 || rank >= world_size) {
    throw std::invalid_argument("DistributedBatchSampler: rank " + std::to_string(rank) +
                                " outside [0, " + std::to_string(world_size) + ")");
  }
  const int64_t global_batch = micro_batch * grad_accum_steps * world_size;
  batches_per_epoch_ = num_windows / global_batch;
  if (batches_per_epoch_ == 0) {
    throw std::invalid_argument(
        "DistributedBatchSampler: " + std::to_string(num_windows) +
        " windows cannot fill one global batch of " + std::to_string(global_batch) +
        " (micro_batch " + std::to_string(micro_batch) + " x grad_accum_steps " +
        std::to_string(grad_accum_steps) + " x world_size " + std::to_string(world_size) +
        "); use a shorter sequence length, smaller batches, or more text");
  }
  permutation_ = epoch_permutation(num_windows_, seed_, epoch_);
}

std::vector<int64_t> DistributedBatchSampler::next_micro_batch() {
  if (next_micro_ == micro_batches_per_epoch()) {
    ++epoch_;
    next_micro_ = 0;
    permutation_ = epoch_permutation(num_windows_, seed_, epoch_);
  }
  std::vector<int64_t> windows(static_cast<size_t>(micro_batch_));
  for (int64_t j = 0; j < micro_batch_; ++j) {
    windows[j] = permutation_[(next_micro_ * micro_batch_ + j) * world_size_ + rank_];
  }
  ++next_micro_;
  return windows;
}

void DistributedBatchSampler::set_position(int64_t epoch, int64_t micro_batch_in_epoch) {
  if (epoch < 0 || micro_batch_in_epoch < 0 || micro_batch_in_epoch > micro_batches_per_epoch()) {
    throw std::invalid_argument("DistributedBatchSampler::set_position: epoch " +
                                std::to_string(epoch) + ", micro-batch " +
                                std::to_string(micro_batch_in_epoch) + " (expected 0.." +
                                std::to_string(micro_batches_per_epoch()) + ")");
  }
  if (epoch != epoch_) permutation_ = epoch_permutation(num_windows_, seed_, epoch);
  epoch_ = epoch;
  next_micro_ = micro_batch_in_epoch;
}

std::vector<int64_t> DistributedBatchSampler::epoch_permutation(int64_t num_windows, uint64_t seed,
                                                                int64_t epoch) {
  std::vector<int64_t> perm(static_cast<size_t>(num_windows));
  for (int64_t i = 0; i < num_windows; ++i) perm[i] = i;
  uint64_t state = seed ^ (0x9E3779B97F4A7C15ull * static_cast<uint64_t>(epoch + 1));
  for (int64_t i = num_windows - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(uniform_below(&state, static_cast<uint64_t>(i + 1)));
    std::swap(perm[i], perm[j]);
  }
  return perm;
}

}  // namespace deepspeed::examples
