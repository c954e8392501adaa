// The Mersenne Twister as Matsumoto and Nishimura published it (init_genrand, init_by_array,
// genrand_int32), seeded the way CPython's random_seed passes an integer to init_by_array, and
// CPython's _randbelow and sample drawing from it.
#include "sparse_attention/python_random.h"

#include <cmath>
#include <set>
#include <stdexcept>
#include <string>

namespace deepspeed::sparse_attention {

PythonRandom::PythonRandom(uint64_t seed) {
  // The seed's 32-bit words, least significant first; at least one (seed 0 is the key [0]).
  std::vector<uint32_t> key{static_cast<uint32_t>(seed)};
  if (seed >> 32) key.push_back(static_cast<uint32_t>(seed >> 32));

  mt_[0] = 19650218U;
  for (int i = 1; i < kN; ++i) {
    mt_[i] = 1812433253U * (mt_[i - 1] ^ (mt_[i - 1] >> 30)) + static_cast<uint32_t>(i);
  }
  int i = 1;
  size_t j = 0;
  for (size_t k = std::max<size_t>(kN, key.size()); k > 0; --k) {
    mt_[i] = (mt_[i] ^ ((mt_[i - 1] ^ (mt_[i - 1] >> 30)) * 1664525U)) + key[j] +
             static_cast<uint32_t>(j);
    ++i;
    ++j;
    if (i >= kN) {
      mt_[0] = mt_[kN - 1];
      i = 1;
    }
    if (j >= key.size()) j = 0;
  }
  for (int k = kN - 1; k > 0; --k) {
    mt_[i] =
        (mt_[i] ^ ((mt_[i - 1] ^ (mt_[i - 1] >> 30)) * 1566083941U)) - static_cast<uint32_t>(i);
    ++i;
    if (i >= kN) {
      mt_[0] = mt_[kN - 1];
      i = 1;
    }
  }
  mt_[0] = 0x80000000U;  // a non-zero initial state
  index_ = kN;
}

uint32_t PythonRandom::next_uint32() {
  constexpr int kM = 397;
  constexpr uint32_t kMatrixA = 0x9908b0dfU, kUpper = 0x80000000U, kLower = 0x7fffffffU;
  if (index_ >= kN) {
    for (int k = 0; k < kN; ++k) {
      const uint32_t y = (mt_[k] & kUpper) | (mt_[(k + 1) % kN] & kLower);
      mt_[k] = mt_[(k + kM) % kN] ^ (y >> 1) ^ ((y & 1U) ? kMatrixA : 0U);
    }
    index_ = 0;
  }
  uint32_t y = mt_[index_++];
  y ^= y >> 11;
  y ^= (y << 7) & 0x9d2c5680U;
  y ^= (y << 15) & 0xefc60000U;
  y ^= y >> 18;
  return y;
}

uint32_t PythonRandom::getrandbits(int k) {
  if (k < 1 || k > 32) throw std::invalid_argument("getrandbits: k must be 1 to 32");
  return next_uint32() >> (32 - k);
}

int64_t PythonRandom::randbelow(int64_t n) {
  if (n < 1 || n > (int64_t{1} << 32)) throw std::invalid_argument("randbelow: n out of range");
  int bits = 0;
  for (uint64_t v = static_cast<uint64_t>(n); v != 0; v >>= 1) ++bits;  // n.bit_length()
  int64_t r = getrandbits(std::min(bits, 32));
  while (r >= n) r = getrandbits(std::min(bits, 32));
  return r;
}

std::vector<int64_t> PythonRandom::sample(int64_t n, int64_t k) {
  if (k < 0 || k > n) {
    throw std::invalid_argument("sample: " + std::to_string(k) + " draws from a population of " +
                                std::to_string(n));
  }
  std::vector<int64_t> result(static_cast<size_t>(k));
  // CPython picks the cheaper bookkeeping: a pool the size of the population, or a set of
  // the picks so far; the two draw differently, so the choice is part of the sequence.
  int64_t setsize = 21;
  if (k > 5) {
    setsize += static_cast<int64_t>(
        std::pow(4.0, std::ceil(std::log(static_cast<double>(k * 3)) / std::log(4.0))));
  }
  if (n <= setsize) {
    std::vector<int64_t> pool(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) pool[i] = i;
    for (int64_t i = 0; i < k; ++i) {
      const int64_t j = randbelow(n - i);
      result[i] = pool[j];
      pool[j] = pool[n - i - 1];
    }
  } else {
    std::set<int64_t> selected;
    for (int64_t i = 0; i < k; ++i) {
      int64_t j = randbelow(n);
      while (selected.count(j) != 0) j = randbelow(n);
      selected.insert(j);
      result[i] = j;
    }
  }
  return result;
}

}  // namespace deepspeed::sparse_attention
