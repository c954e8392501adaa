// SHA-256 (FIPS 180-4) for verifying the vocabulary files, the extracted corpus and the token
// cache's source. Owns hashing only; reading files with error messages lives in file_util.h.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace deepspeed::examples {

using Sha256Digest = std::array<uint8_t, 32>;

// Incremental hasher: update() any number of times, then digest() once.
class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t size_bytes);
  void update(std::string_view bytes) { update(bytes.data(), bytes.size()); }
  // Finishes the hash; the object must not be updated afterwards.
  Sha256Digest digest();

 private:
  void compress(const uint8_t* block);

  std::array<uint32_t, 8> state_;
  std::array<uint8_t, 64> block_;
  size_t block_fill_ = 0;
  uint64_t total_bytes_ = 0;
};

Sha256Digest sha256(std::string_view bytes);
// Lower-case hex, as sha256sum prints it.
std::string to_hex(const Sha256Digest& digest);
std::string sha256_hex(std::string_view bytes);

}  // namespace deepspeed::examples
