// Python's `random` module generator, as far as DeepSpeed's random sparsity layouts draw from it:
// MT19937 seeded as random.seed(n) seeds it, and random.sample(range(n), k). With it a layout
// built from seed s equals DeepSpeed's built after random.seed(s).
#pragma once

#include <array>
#include <cstdint>
#include <vector>

namespace deepspeed::sparse_attention {

class PythonRandom {
 public:
  /// random.seed(seed) for a non-negative integer seed.
  explicit PythonRandom(uint64_t seed);

  /// The next 32-bit output of the Mersenne Twister (CPython's genrand_uint32).
  uint32_t next_uint32();
  /// random.getrandbits(k), 1 <= k <= 32.
  uint32_t getrandbits(int k);
  /// random._randbelow(n) for n >= 1: rejection sampling on n's bit length.
  int64_t randbelow(int64_t n);
  /// random.sample(range(n), k), 0 <= k <= n, in the order Python returns them.
  std::vector<int64_t> sample(int64_t n, int64_t k);

 private:
  static constexpr int kN = 624;
  std::array<uint32_t, kN> mt_{};
  int index_ = kN;
};

}  // namespace deepspeed::sparse_attention
