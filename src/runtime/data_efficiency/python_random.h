// Python's random.Random(seed).shuffle, draw for draw: DeepSpeed shuffles dynamic batching's
// "random" picking order with it, so the same seed gives the same batches here.
#pragma once

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

namespace deepspeed::data_sampling::detail {

/// A Mersenne Twister in the state random.Random(seed) leaves it (CPython's init_by_array over
/// the 32-bit words of |seed|); std::mt19937's outputs are then CPython's genrand_uint32.
std::mt19937 python_random(int64_t seed);

/// random.shuffle(items): for i from n-1 down to 1, swap i with _randbelow(i + 1), which draws
/// getrandbits(bit_length(i + 1)) until the value is below i + 1.
template <typename T>
void python_shuffle(std::vector<T>& items, std::mt19937& gen) {
  for (size_t i = items.size(); i-- > 1;) {
    const uint64_t n = i + 1;
    int bits = 0;
    while ((n >> bits) != 0) ++bits;
    uint64_t r;
    do {
      r = static_cast<uint64_t>(gen()) >> (32 - bits);  // n < 2^32 (vector sizes here)
    } while (r >= n);
    std::swap(items[i], items[r]);
  }
}

}  // namespace deepspeed::data_sampling::detail
