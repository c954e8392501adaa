#include "runtime/data_efficiency/python_random.h"

#include <algorithm>
#include <sstream>

namespace deepspeed::data_sampling::detail {

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
    mt[i] = (mt[i] ^ ((mt[i - 1] ^ (mt[i - 1] >> 30)) * 1664525u)) + key[j] +
            static_cast<uint32_t>(j);
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

}  // namespace deepspeed::data_sampling::detail
