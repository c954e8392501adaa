// A minimal protocol-buffer encoder: just the wire types TensorBoard's Event and Summary messages
// use (varint, 64-bit, length-delimited, 32-bit). Hand-written so that writing event files needs
// neither libprotobuf nor generated code. Fields are appended in the order the caller writes them.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace deepspeed::monitor::detail {

enum class WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

class ProtoWriter {
 public:
  void write_varint(uint64_t v) {
    while (v >= 0x80) {
      out_.push_back(static_cast<char>((v & 0x7F) | 0x80));
      v >>= 7;
    }
    out_.push_back(static_cast<char>(v));
  }
  void write_tag(uint32_t field, WireType type) {
    write_varint((static_cast<uint64_t>(field) << 3) | static_cast<uint32_t>(type));
  }
  /// int64 fields are plain varints of the two's-complement value (negative: 10 bytes).
  void write_int64(uint32_t field, int64_t v) {
    write_tag(field, WireType::kVarint);
    write_varint(static_cast<uint64_t>(v));
  }
  void write_double(uint32_t field, double v) {
    write_tag(field, WireType::kFixed64);
    uint64_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    write_little_endian(bits, 8);
  }
  void write_float(uint32_t field, float v) {
    write_tag(field, WireType::kFixed32);
    uint32_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    write_little_endian(bits, 4);
  }
  /// Strings, bytes and embedded messages.
  void write_bytes(uint32_t field, std::string_view bytes) {
    write_tag(field, WireType::kLengthDelimited);
    write_varint(bytes.size());
    out_.append(bytes.data(), bytes.size());
  }

  const std::string& bytes() const { return out_; }

 private:
  void write_little_endian(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
  }
  std::string out_;
};

}  // namespace deepspeed::monitor::detail
