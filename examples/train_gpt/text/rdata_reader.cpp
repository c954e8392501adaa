// R lazy-load database reader: the .rdx index, zlib records, and a minimal reader of R's XDR
// serialization (enough for the index's list and for character vectors). Format facts were
// checked against the bytes of r-cran-janeaustenr 1.0.0-1; see docs/data.md.
#include "rdata_reader.h"

#include <zlib.h>

#include <climits>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <utility>

#include "file_util.h"

namespace deepspeed::examples {
namespace {

// SEXPTYPE codes and flag bits of R's serialize.c format (R Internals, "Serialization Formats").
enum RType : int {
  kSymbol = 1,
  kPairList = 2,
  kChars = 9,
  kLogical = 10,
  kInteger = 13,
  kReal = 14,
  kCharacter = 16,
  kList = 19,
  kNilValue = 254,
  kReference = 255,
};
constexpr uint32_t kHasAttributesBit = 1u << 9;
constexpr uint32_t kHasTagBit = 1u << 10;
// CHARSXP encoding bits, in the "levels" field (flags >> 12).
constexpr uint32_t kLatin1Level = 1u << 2;
constexpr uint32_t kUtf8Level = 1u << 3;
constexpr uint32_t kAsciiLevel = 1u << 6;
constexpr int kMaxDepth = 64;
// zlib cannot expand data by more than ~1032:1, so a larger claimed length means corruption
// (checked before allocating, so a damaged header cannot ask for gigabytes).
constexpr uint64_t kMaxZlibRatio = 1032;

// One deserialized R value; only the fields of its type are filled.
struct RObject {
  int type = kNilValue;
  std::vector<std::string> strings;  // character vector elements; symbol name in strings[0]
  std::vector<bool> is_na;           // parallel to strings
  std::vector<int32_t> ints;         // logical / integer vector
  std::vector<double> reals;         // double vector
  std::vector<RObject> items;        // list elements, pairlist values
  std::vector<std::string> tags;     // pairlist tags, parallel to items
  std::vector<RObject> attributes;   // empty, or one pairlist
};

const RObject* find_attribute(const RObject& obj, const std::string& name) {
  if (obj.attributes.empty()) return nullptr;
  const RObject& list = obj.attributes[0];
  for (size_t i = 0; i < list.tags.size(); ++i) {
    if (list.tags[i] == name) return &list.items[i];
  }
  return nullptr;
}

std::string latin1_to_utf8(const std::string& in) {
  std::string out;
  out.reserve(in.size());
  for (unsigned char c : in) {
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back(static_cast<char>(0xC0 | (c >> 6)));
      out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    }
  }
  return out;
}

// Reads one R serialization (format 'X' = XDR, big-endian) from memory.
class XdrReader {
 public:
  // `where` prefixes every error, e.g. "Rdata.rdb: record at byte 352043".
  XdrReader(std::string_view data, std::string where) : data_(data), where_(std::move(where)) {}

  RObject read_stream() {
    if (data_.size() < 2 || data_.substr(0, 2) != "X\n") {
      fail(
          "not an R XDR serialization (expected \"X\\n\"; ASCII and native-binary "
          "serializations are not supported)");
    }
    pos_ = 2;
    const int32_t version = read_i32();
    read_i32();  // R version that wrote it
    read_i32();  // oldest R version that can read it
    if (version == 3) {
      const int32_t len = read_i32();
      if (len < 0 || static_cast<size_t>(len) > remaining()) fail("bad native-encoding length");
      native_encoding_ = std::string(data_.substr(pos_, len));
      pos_ += len;
    } else if (version != 2) {
      fail("serialization format version " + std::to_string(version) + " (expected 2 or 3)");
    }
    RObject obj = read_item(0);
    if (pos_ != data_.size()) {
      fail(std::to_string(data_.size() - pos_) + " unexpected bytes after the object");
    }
    return obj;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error(where_ + ", serialized byte " + std::to_string(pos_) + ": " + what);
  }
  size_t remaining() const { return data_.size() - pos_; }

  uint32_t read_u32() {
    if (remaining() < 4) fail("truncated (needed 4 more bytes)");
    const auto* p = reinterpret_cast<const unsigned char*>(data_.data() + pos_);
    pos_ += 4;
    return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
  }
  int32_t read_i32() { return static_cast<int32_t>(read_u32()); }

  // Vector length, including R's "long vector" escape (-1, then two 32-bit halves), checked
  // against the bytes left so a corrupt length fails here rather than in an allocation.
  size_t read_length(size_t min_bytes_per_element) {
    int64_t len = read_i32();
    if (len == -1) {
      const uint64_t hi = read_u32();
      len = static_cast<int64_t>((hi << 32) | read_u32());
    }
    if (len < 0) fail("negative vector length " + std::to_string(len));
    if (static_cast<uint64_t>(len) > remaining() / min_bytes_per_element) {
      fail("vector of " + std::to_string(len) + " elements does not fit in the " +
           std::to_string(remaining()) + " bytes left");
    }
    return static_cast<size_t>(len);
  }

  // A CHARSXP body after its flags: length (-1 = NA) and bytes, converted to UTF-8.
  std::string read_chars(uint32_t flags, bool* is_na) {
    const int32_t len = read_i32();
    *is_na = len == -1;
    if (*is_na) return std::string();
    if (len < 0 || static_cast<size_t>(len) > remaining()) {
      fail("string length " + std::to_string(len) + " exceeds the " + std::to_string(remaining()) +
           " bytes left");
    }
    std::string s(data_.substr(pos_, len));
    pos_ += len;
    const uint32_t levels = flags >> 12;
    const bool native_latin1 = native_encoding_ == "latin1" || native_encoding_ == "ISO-8859-1";
    if ((levels & kLatin1Level) || (native_latin1 && !(levels & (kUtf8Level | kAsciiLevel)))) {
      s = latin1_to_utf8(s);
    }
    return s;
  }

  std::string read_symbol_name(int depth) {
    const RObject sym = read_item(depth + 1);
    if (sym.type != kSymbol) {
      fail("expected a symbol (a tag), found R type " + std::to_string(sym.type));
    }
    return sym.strings[0];
  }

  RObject read_item(int depth) {
    if (depth > kMaxDepth) fail("objects nested deeper than " + std::to_string(kMaxDepth));
    const uint32_t flags = read_u32();
    RObject obj;
    obj.type = static_cast<int>(flags & 0xFF);
    switch (obj.type) {
      case kNilValue:
        return obj;
      case kReference: {
        // Back-reference to an earlier symbol (1-based), index in the flags or the next word.
        uint32_t index = flags >> 8;
        if (index == 0) index = read_u32();
        if (index == 0 || index > symbols_.size()) {
          fail("reference to object #" + std::to_string(index) + " of " +
               std::to_string(symbols_.size()) + " (only symbols are supported as references)");
        }
        obj.type = kSymbol;
        obj.strings = {symbols_[index - 1]};
        return obj;
      }
      case kSymbol: {
        const uint32_t chars_flags = read_u32();
        if ((chars_flags & 0xFF) != kChars) fail("symbol without a name string");
        bool na = false;
        obj.strings = {read_chars(chars_flags, &na)};
        symbols_.push_back(obj.strings[0]);
        return obj;
      }
      case kPairList:
        read_pairlist_body(flags, depth, &obj);
        return obj;
      case kChars: {
        bool na = false;
        obj.strings = {read_chars(flags, &na)};
        obj.is_na = {na};
        return obj;
      }
      case kLogical:
      case kInteger: {
        const size_t n = read_length(4);
        obj.ints.resize(n);
        for (size_t i = 0; i < n; ++i) obj.ints[i] = read_i32();
        break;
      }
      case kReal: {
        const size_t n = read_length(8);
        obj.reals.resize(n);
        for (size_t i = 0; i < n; ++i) {
          const uint64_t hi = read_u32();
          const uint64_t bits = (hi << 32) | read_u32();
          std::memcpy(&obj.reals[i], &bits, sizeof(double));
        }
        break;
      }
      case kCharacter: {
        const size_t n = read_length(8);
        obj.strings.resize(n);
        obj.is_na.resize(n);
        for (size_t i = 0; i < n; ++i) {
          const uint32_t element_flags = read_u32();
          if ((element_flags & 0xFF) != kChars) {
            fail("element " + std::to_string(i) + " of a character vector has R type " +
                 std::to_string(element_flags & 0xFF) + " (expected 9, a string)");
          }
          bool na = false;
          obj.strings[i] = read_chars(element_flags, &na);
          obj.is_na[i] = na;
        }
        break;
      }
      case kList: {
        const size_t n = read_length(4);
        obj.items.reserve(n);
        for (size_t i = 0; i < n; ++i) obj.items.push_back(read_item(depth + 1));
        break;
      }
      default:
        fail("unsupported R object type " + std::to_string(obj.type) +
             " (this reader handles character, logical, integer and double vectors, lists, "
             "pairlists and symbols)");
    }
    if (flags & kHasAttributesBit) obj.attributes.push_back(read_attributes(depth));
    return obj;
  }

  RObject read_attributes(int depth) {
    RObject attributes = read_item(depth + 1);
    if (attributes.type != kPairList) fail("attributes are not a pairlist");
    return attributes;
  }

  // Pairlist cells in order: [attributes] [tag] value, then the next cell (or NILVALUE).
  // Walked iteratively so a long pairlist does not recurse once per cell.
  void read_pairlist_body(uint32_t flags, int depth, RObject* obj) {
    for (;;) {
      if (flags & kHasAttributesBit) read_attributes(depth);
      obj->tags.push_back((flags & kHasTagBit) ? read_symbol_name(depth) : std::string());
      obj->items.push_back(read_item(depth + 1));
      flags = read_u32();
      if ((flags & 0xFF) == kNilValue) return;
      if ((flags & 0xFF) != kPairList) {
        fail("dotted pairlist (tail of R type " + std::to_string(flags & 0xFF) +
             ") is not supported");
      }
    }
  }

  std::string_view data_;
  std::string where_;
  size_t pos_ = 0;
  std::string native_encoding_;
  std::vector<std::string> symbols_;
};

uint32_t read_be32(const std::string& bytes, size_t offset) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data() + offset);
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

// Inflates the stream starting at input[offset] (at most `available` bytes). window_bits as
// for inflateInit2 (15 = zlib, 15 + 32 = zlib or gzip). expected_size 0 means unknown.
// Returns the output and sets *consumed to the stream's compressed length.
std::string inflate_stream(const std::string& input, size_t offset, size_t available,
                           int window_bits, size_t expected_size, size_t* consumed,
                           const std::string& where) {
  z_stream zs{};
  if (inflateInit2(&zs, window_bits) != Z_OK) {
    throw std::runtime_error(where + ": inflateInit failed");
  }
  std::string out(expected_size > 0 ? expected_size : available * 4 + 1024, '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(input.data() + offset));
  zs.avail_in = static_cast<uInt>(std::min<size_t>(available, UINT_MAX));
  int rc = Z_OK;
  while (rc == Z_OK) {
    if (zs.total_out == out.size()) {
      if (expected_size > 0) break;  // full but not ended: longer than the header claims
      out.resize(out.size() * 2);
    }
    zs.next_out = reinterpret_cast<Bytef*>(&out[zs.total_out]);
    zs.avail_out = static_cast<uInt>(std::min<size_t>(out.size() - zs.total_out, UINT_MAX));
    rc = inflate(&zs, Z_NO_FLUSH);
  }
  const size_t total_out = zs.total_out;
  *consumed = zs.total_in;
  const std::string message = zs.msg ? zs.msg : "";
  inflateEnd(&zs);
  if (rc != Z_STREAM_END) {
    std::string why = rc == Z_OK || rc == Z_BUF_ERROR
                          ? (total_out >= expected_size && expected_size > 0
                                 ? "decompresses to more than the " +
                                       std::to_string(expected_size) + " bytes its header claims"
                                 : "compressed data is truncated")
                          : "corrupt compressed data (zlib: " + message + ")";
    throw std::runtime_error(where + ": " + why);
  }
  if (expected_size > 0 && total_out != expected_size) {
    throw std::runtime_error(where + ": decompresses to " + std::to_string(total_out) +
                             " bytes but its header claims " + std::to_string(expected_size));
  }
  out.resize(total_out);
  return out;
}

struct IndexEntry {
  std::string name;
  size_t offset = 0;
  size_t length = 0;
};

struct RdbIndex {
  std::vector<IndexEntry> entries;
  int compression = 1;  // 0 none, 1 zlib, 2 bzip2, 3 xz (R's makeLazyLoadDB `compress`)
};

double first_number(const RObject& obj) {
  if (!obj.ints.empty()) return obj.ints[0];
  if (!obj.reals.empty()) return obj.reals[0];
  return -1;
}

RdbIndex read_rdx(const std::string& rdx_path) {
  const std::string raw = read_file(rdx_path);
  std::string serialized;
  if (raw.size() >= 2 && static_cast<unsigned char>(raw[0]) == 0x1f &&
      static_cast<unsigned char>(raw[1]) == 0x8b) {
    size_t consumed = 0;  // saveRDS() default: gzip
    serialized = inflate_stream(raw, 0, raw.size(), 15 + 32, 0, &consumed, rdx_path);
  } else if (raw.size() >= 2 && raw.compare(0, 2, "X\n") == 0) {
    serialized = raw;
  } else if (raw.size() > 4 && static_cast<unsigned char>(raw[4]) == 0x78) {
    size_t consumed = 0;  // 4-byte length + zlib, as inside the .rdb
    serialized = inflate_stream(raw, 4, raw.size() - 4, 15, read_be32(raw, 0), &consumed, rdx_path);
  } else {
    throw std::runtime_error(rdx_path +
                             ": not a gzip, zlib or XDR R index (bzip2/xz-compressed "
                             "indexes are not supported)");
  }
  const RObject top = XdrReader(serialized, rdx_path).read_stream();
  const RObject* names = find_attribute(top, "names");
  const RObject* variables = nullptr;
  const RObject* compressed = nullptr;
  for (size_t i = 0; names && i < names->strings.size() && i < top.items.size(); ++i) {
    if (names->strings[i] == "variables") variables = &top.items[i];
    if (names->strings[i] == "compressed") compressed = &top.items[i];
  }
  if (top.type != kList || variables == nullptr || variables->type != kList) {
    throw std::runtime_error(rdx_path +
                             ": not a lazy-load index (expected a list with a "
                             "\"variables\" element)");
  }
  RdbIndex index;
  if (compressed) index.compression = static_cast<int>(first_number(*compressed));
  const RObject* variable_names = find_attribute(*variables, "names");
  for (size_t i = 0; i < variables->items.size(); ++i) {
    const RObject& pos = variables->items[i];
    const size_t count = pos.ints.size() + pos.reals.size();
    if (count != 2) {
      throw std::runtime_error(rdx_path + ": variable #" + std::to_string(i) +
                               " has no (offset, length) pair");
    }
    IndexEntry e;
    e.name = variable_names && i < variable_names->strings.size() ? variable_names->strings[i] : "";
    const double offset = pos.ints.empty() ? pos.reals[0] : pos.ints[0];
    const double length = pos.ints.empty() ? pos.reals[1] : pos.ints[1];
    if (offset < 0 || length < 0) {
      throw std::runtime_error(rdx_path + ": variable '" + e.name +
                               "' has a negative offset or length");
    }
    e.offset = static_cast<size_t>(offset);
    e.length = static_cast<size_t>(length);
    index.entries.push_back(e);
  }
  return index;
}

std::string rdx_path_for(const std::string& rdb_path) {
  const size_t dot = rdb_path.rfind('.');
  const size_t slash = rdb_path.rfind('/');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) {
    return rdb_path + ".rdx";
  }
  return rdb_path.substr(0, dot) + ".rdx";
}

RdbCharacterVector decode_record(const std::string& serialized, const std::string& where,
                                 const std::string& name) {
  RObject obj = XdrReader(serialized, where).read_stream();
  if (obj.type != kCharacter) {
    throw std::runtime_error(where + ": R object of type " + std::to_string(obj.type) +
                             ", not a character vector (type 16)");
  }
  return RdbCharacterVector{name, std::move(obj.strings)};  // NA elements are already ""
}

}  // namespace

std::vector<RdbCharacterVector> read_rdb_named_character_vectors(const std::string& rdb_path) {
  const std::string db = read_file(rdb_path);
  std::vector<RdbCharacterVector> out;
  const std::string rdx_path = rdx_path_for(rdb_path);
  if (rdx_path != rdb_path && file_exists(rdx_path)) {
    const RdbIndex index = read_rdx(rdx_path);
    for (const IndexEntry& e : index.entries) {
      const std::string where =
          rdb_path + ": record '" + e.name + "' at byte " + std::to_string(e.offset);
      if (e.offset > db.size() || e.length > db.size() - e.offset || e.length < 5) {
        throw std::runtime_error(where + " (" + std::to_string(e.length) + " bytes, per " +
                                 rdx_path + ") lies outside the " + std::to_string(db.size()) +
                                 "-byte file; the .rdb and .rdx do not belong together");
      }
      std::string serialized;
      if (index.compression == 0) {
        serialized = db.substr(e.offset, e.length);
      } else {
        // zlib records: 4-byte length, stream. bzip2/xz (2, 3) add a type byte after the length;
        // '0' there means the record was stored uncompressed.
        size_t header = 4;
        if (index.compression == 2 || index.compression == 3) {
          header = 5;
          if (db[e.offset + 4] != '0') {
            throw std::runtime_error(where +
                                     ": bzip2/xz-compressed records are not supported; "
                                     "re-save the database with compress = TRUE (zlib)");
          }
        }
        const size_t expected = read_be32(db, e.offset);
        if (header == 5) {
          serialized = db.substr(e.offset + 5, e.length - 5);
        } else {
          if (expected > (e.length - 4) * kMaxZlibRatio + 1024) {
            throw std::runtime_error(where + ": header claims " + std::to_string(expected) +
                                     " uncompressed bytes, impossible for " +
                                     std::to_string(e.length - 4) + " compressed bytes");
          }
          size_t consumed = 0;
          serialized =
              inflate_stream(db, e.offset + 4, e.length - 4, 15, expected, &consumed, where);
          if (consumed != e.length - 4) {
            throw std::runtime_error(where + ": zlib stream is " + std::to_string(consumed) +
                                     " bytes but the index gives " + std::to_string(e.length - 4));
          }
        }
      }
      out.push_back(decode_record(serialized, where, e.name));
    }
    return out;
  }

  // No index: zlib records back to back from the start of the file.
  for (size_t offset = 0; offset < db.size();) {
    const std::string where =
        rdb_path + ": record #" + std::to_string(out.size()) + " at byte " + std::to_string(offset);
    if (db.size() - offset < 5) {
      throw std::runtime_error(where + ": truncated (" + std::to_string(db.size() - offset) +
                               " bytes left; a record is a 4-byte length and a zlib stream)");
    }
    const size_t expected = read_be32(db, offset);
    const size_t available = db.size() - offset - 4;
    if (expected > available * kMaxZlibRatio + 1024) {
      throw std::runtime_error(where + ": header claims " + std::to_string(expected) +
                               " uncompressed bytes, impossible for the " +
                               std::to_string(available) + " bytes left");
    }
    size_t consumed = 0;
    const std::string serialized =
        inflate_stream(db, offset + 4, available, 15, expected, &consumed, where);
    out.push_back(decode_record(serialized, where, ""));
    offset += 4 + consumed;
  }
  return out;
}

std::vector<std::vector<std::string>> read_rdb_character_vectors(const std::string& path) {
  std::vector<std::vector<std::string>> out;
  for (auto& object : read_rdb_named_character_vectors(path))
    out.push_back(std::move(object.lines));
  return out;
}

std::string austen_corpus_text(const std::string& rdb_path) {
  static const char* const kBooks[] = {"emma",       "mansfieldpark",  "northangerabbey",
                                       "persuasion", "prideprejudice", "sensesensibility"};
  const auto books = read_rdb_named_character_vectors(rdb_path);
  bool names_match = books.size() == std::size(kBooks);
  for (size_t i = 0; names_match && i < books.size(); ++i) {
    names_match = books[i].name.empty() || books[i].name == kBooks[i];
  }
  if (!names_match) {
    std::string found;
    for (const auto& b : books)
      found += (found.empty() ? "" : ", ") + (b.name.empty() ? "?" : b.name);
    throw std::runtime_error(rdb_path +
                             ": expected the six novels of r-cran-janeaustenr 1.0.0 "
                             "(emma ... sensesensibility), found " +
                             std::to_string(books.size()) + " objects (" + found +
                             "); pass usr/lib/R/site-library/janeaustenr/"
                             "data/Rdata.rdb from that package");
  }
  std::string text;
  text.reserve(kAustenCorpusBytes);
  for (size_t b = 0; b < books.size(); ++b) {
    if (b > 0) text += "\n\n";
    for (size_t i = 0; i < books[b].lines.size(); ++i) {
      if (i > 0) text += '\n';
      text += books[b].lines[i];
    }
  }
  return text;
}

}  // namespace deepspeed::examples
