// Encoding and decoding of TensorBoard events (see event_file_format.h for the layout).
#include "monitor/event_file_format.h"

#include <cstring>
#include <fstream>
#include <sstream>

#include "monitor/crc32c.h"
#include "monitor/proto_writer.h"
#include "util/check.h"

namespace deepspeed::monitor::detail {

std::string encode_file_version_event(double wall_time) {
  ProtoWriter event;
  event.write_double(kEventWallTime, wall_time);
  event.write_bytes(kEventFileVersion, kFileVersion);
  return event.bytes();
}

std::string encode_scalar_event(double wall_time, int64_t step, std::string_view tag, float value) {
  ProtoWriter v;
  v.write_bytes(kValueTag, tag);
  v.write_float(kValueSimpleValue, value);
  ProtoWriter summary;
  summary.write_bytes(kSummaryValue, v.bytes());
  ProtoWriter event;
  event.write_double(kEventWallTime, wall_time);
  if (step != 0) event.write_int64(kEventStep, step);
  event.write_bytes(kEventSummary, summary.bytes());
  return event.bytes();
}

namespace {

void append_le(std::string& out, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

uint64_t read_le(std::string_view bytes, size_t at, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i)
    v |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[at + i])) << (8 * i);
  return v;
}

// Reads protobuf fields from one message; `where` names the message in errors.
class ProtoReader {
 public:
  ProtoReader(std::string_view bytes, std::string where)
      : bytes_(bytes), where_(std::move(where)) {}

  bool done() const { return pos_ >= bytes_.size(); }

  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      DS_CHECK(pos_ < bytes_.size(), Error, where_, ": truncated varint");
      auto b = static_cast<unsigned char>(bytes_[pos_++]);
      v |= static_cast<uint64_t>(b & 0x7F) << shift;
      if ((b & 0x80) == 0) return v;
    }
    throw Error(where_ + ": varint longer than 10 bytes");
  }
  uint64_t fixed(int n) {
    DS_CHECK(pos_ + n <= bytes_.size(), Error, where_, ": truncated fixed", 8 * n, " field");
    uint64_t v = read_le(bytes_, pos_, n);
    pos_ += n;
    return v;
  }
  std::string_view length_delimited() {
    uint64_t n = varint();
    DS_CHECK(n <= bytes_.size() - pos_, Error, where_, ": length-delimited field of ", n,
             " bytes runs past the end of its message");
    std::string_view s = bytes_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  void skip(WireType type) {
    switch (type) {
      case WireType::kVarint:
        varint();
        return;
      case WireType::kFixed64:
        fixed(8);
        return;
      case WireType::kLengthDelimited:
        length_delimited();
        return;
      case WireType::kFixed32:
        fixed(4);
        return;
    }
    throw Error(where_ + ": unsupported wire type " + std::to_string(static_cast<int>(type)));
  }
  const std::string& where() const { return where_; }

 private:
  std::string_view bytes_;
  std::string where_;
  size_t pos_ = 0;
};

ScalarValue parse_value(std::string_view bytes, const std::string& where) {
  ProtoReader r(bytes, where + " Summary.Value");
  ScalarValue v;
  while (!r.done()) {
    uint64_t key = r.varint();
    auto field = static_cast<uint32_t>(key >> 3);
    auto type = static_cast<WireType>(key & 7);
    if (field == kValueTag && type == WireType::kLengthDelimited) {
      v.tag = std::string(r.length_delimited());
    } else if (field == kValueSimpleValue && type == WireType::kFixed32) {
      auto bits = static_cast<uint32_t>(r.fixed(4));
      std::memcpy(&v.simple_value, &bits, sizeof bits);
    } else {
      r.skip(type);
    }
  }
  return v;
}

EventRecord parse_event(std::string_view bytes, const std::string& where) {
  ProtoReader r(bytes, where + " Event");
  EventRecord e;
  while (!r.done()) {
    uint64_t key = r.varint();
    auto field = static_cast<uint32_t>(key >> 3);
    auto type = static_cast<WireType>(key & 7);
    if (field == kEventWallTime && type == WireType::kFixed64) {
      uint64_t bits = r.fixed(8);
      std::memcpy(&e.wall_time, &bits, sizeof bits);
    } else if (field == kEventStep && type == WireType::kVarint) {
      e.step = static_cast<int64_t>(r.varint());
    } else if (field == kEventFileVersion && type == WireType::kLengthDelimited) {
      e.file_version = std::string(r.length_delimited());
    } else if (field == kEventSummary && type == WireType::kLengthDelimited) {
      ProtoReader s(r.length_delimited(), where + " Summary");
      while (!s.done()) {
        uint64_t skey = s.varint();
        auto stype = static_cast<WireType>(skey & 7);
        if ((skey >> 3) == kSummaryValue && stype == WireType::kLengthDelimited) {
          e.values.push_back(parse_value(s.length_delimited(), where));
        } else {
          s.skip(stype);
        }
      }
    } else {
      r.skip(type);
    }
  }
  return e;
}

}  // namespace

std::string frame_record(std::string_view data) {
  std::string out;
  out.reserve(data.size() + 16);
  std::string length;
  append_le(length, data.size(), 8);
  out += length;
  append_le(out, masked_crc32c(length), 4);
  out.append(data.data(), data.size());
  append_le(out, masked_crc32c(data), 4);
  return out;
}

std::vector<EventRecord> parse_event_records(std::string_view bytes, const std::string& where) {
  std::vector<EventRecord> events;
  size_t pos = 0;
  while (pos < bytes.size()) {
    const std::string at = where + " at byte " + std::to_string(pos);
    DS_CHECK(bytes.size() - pos >= 12, Error, at, ": truncated record header");
    const uint64_t length = read_le(bytes, pos, 8);
    DS_CHECK(read_le(bytes, pos + 8, 4) == masked_crc32c(bytes.substr(pos, 8)), Error, at,
             ": length CRC mismatch (not a TFRecord file, or corrupted)");
    DS_CHECK(length <= bytes.size() - pos - 12 && bytes.size() - pos - 12 - length >= 4, Error, at,
             ": record of ", length, " bytes is truncated");
    std::string_view data = bytes.substr(pos + 12, length);
    DS_CHECK(read_le(bytes, pos + 12 + length, 4) == masked_crc32c(data), Error, at,
             ": data CRC mismatch");
    events.push_back(parse_event(data, at));
    pos += 12 + length + 4;
  }
  return events;
}

std::vector<EventRecord> read_event_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  DS_CHECK(in.good(), Error, "cannot open TensorBoard event file ", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return parse_event_records(ss.str(), path);
}

}  // namespace deepspeed::monitor::detail
