#include "util/python_random.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>

namespace deepspeed::util {

std::mt19937 python_random(int64_t seed) {
  // random.seed(int): the key is |seed| as 32-bit words, least significant first (one word
  // at least).
  uint64_t magnitude = seed < 0 ? 0 - static_cast<uint64_t>(seed) : static_cast<uint64_t>(seed);
  std::vector<uint32_t> key;
  do {
    key.push_back(static_cast<uint32_t>(magnitude));
    magnitude >>= 32;
  } while (magnitude != 0);

  // MT19937's init_by_array (Matsumoto and Nishimura's reference, as CPython has it).
  constexpr size_t kN = 624;
  std::vector<uint32_t> mt(kN);
  mt[0] = 19650218u;
  for (uint32_t i = 1; i < kN; ++i) mt[i] = 1812433253u * (mt[i - 1] ^ (mt[i - 1] >> 30)) + i;
  size_t i = 1;
  size_t j = 0;
  for (size_t k = std::max(kN, key.size()); k > 0; --k) {
    mt[i] =
        (mt[i] ^ ((mt[i - 1] ^ (mt[i - 1] >> 30)) * 1664525u)) + key[j] + static_cast<uint32_t>(j);
    ++i;
    ++j;
    if (i >= kN) {
      mt[0] = mt[kN - 1];
      i = 1;
    }
    if (j >= key.size()) j = 0;
  }
  for (size_t k = kN - 1; k > 0; --k) {
    mt[i] = (mt[i] ^ ((mt[i - 1] ^ (mt[i - 1] >> 30)) * 1566083941u)) - static_cast<uint32_t>(i);
    ++i;
    if (i >= kN) {
      mt[0] = mt[kN - 1];
      i = 1;
    }
  }
  mt[0] = 0x80000000u;

  // std::mt19937's text form is its 624 words and its position; 624 makes the next draw
  // regenerate the block, as CPython's index does after seeding.
  std::ostringstream state;
  for (uint32_t w : mt) state << w << ' ';
  state << kN;
  std::mt19937 gen;
  std::istringstream in(state.str());
  in >> gen;
  return gen;
}

uint64_t python_randbelow(std::mt19937& gen, uint64_t n) {
  if (n < 1 || n >= (uint64_t{1} << 32)) {
    throw std::invalid_argument("python_randbelow: n must be 1 to 2^32 - 1");
  }
  int bits = 0;
  while ((n >> bits) != 0) ++bits;
  uint64_t r;
  do {
    r = static_cast<uint64_t>(gen()) >> (32 - bits);
  } while (r >= n);
  return r;
}

std::vector<int64_t> python_sample(std::mt19937& gen, int64_t n, int64_t k) {
  if (k < 0 || k > n) {
    throw std::invalid_argument("python_sample: " + std::to_string(k) +
                                " picks from a population of " + std::to_string(n));
  }
  std::vector<int64_t> result(static_cast<size_t>(k));
  // CPython's choice: a list of n when it is smaller than a set of k would be.
  int64_t setsize = 21;
  if (k > 5) {
    setsize += static_cast<int64_t>(
        std::pow(4.0, std::ceil(std::log(static_cast<double>(k * 3)) / std::log(4.0))));
  }
  if (n <= setsize) {
    std::vector<int64_t> pool(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) pool[i] = i;
    for (int64_t i = 0; i < k; ++i) {
      const auto j = static_cast<int64_t>(python_randbelow(gen, static_cast<uint64_t>(n - i)));
      result[i] = pool[j];
      pool[j] = pool[n - i - 1];  // the last unpicked one moves into the gap
    }
  } else {
    std::set<int64_t> picked;
    for (int64_t i = 0; i < k; ++i) {
      auto j = static_cast<int64_t>(python_randbelow(gen, static_cast<uint64_t>(n)));
      while (picked.count(j) != 0) j = static_cast<int64_t>(python_randbelow(gen, n));
      picked.insert(j);
      result[i] = j;
    }
  }
  return result;
}

}  // namespace deepspeed::util
