// Python's random module, draw for draw, where DeepSpeed draws from it: random.Random(seed)'s
// generator, and its _randbelow, shuffle and sample. DeepSpeed shuffles dynamic batching's
// "random" picking order with it and picks sparse attention's random blocks with it, so the
// same seed gives the same batches and layouts here.
#pragma once

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

namespace deepspeed::util {

/// A Mersenne Twister in the state random.Random(seed) leaves it (CPython's init_by_array over
/// the 32-bit words of |seed|); std::mt19937's outputs are then CPython's genrand_uint32.
std::mt19937 python_random(int64_t seed);

/// random._randbelow(n), 1 <= n < 2^32: getrandbits(bit_length(n)) (the top bits of one
/// 32-bit draw) until the value is below n.
uint64_t python_randbelow(std::mt19937& gen, uint64_t n);

/// random.shuffle(items): for i from n-1 down to 1, swap i with _randbelow(i + 1).
template <typename T>
void python_shuffle(std::vector<T>& items, std::mt19937& gen) {
  for (size_t i = items.size(); i-- > 1;) std::swap(items[i], items[python_randbelow(gen, i + 1)]);
}

/// random.sample(range(n), k), 0 <= k <= n, in the order Python returns the picks (CPython
/// keeps a pool of the population or a set of the picks, whichever is smaller; the two draw
/// differently).
std::vector<int64_t> python_sample(std::mt19937& gen, int64_t n, int64_t k);

}  // namespace deepspeed::util
