// The R lazy-load reader on synthetic databases built here (XDR serialization + zlib, with and
// without a gzip'd .rdx index), its error messages, and the real package file when present.
#include "rdata_reader.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdint>
#include <optional>
#include <tuple>

#include "sha256.h"
#include "text_test_util.h"

namespace deepspeed::examples {
namespace {

using testing::TempDir;
using testing::write_bytes;

// --- builders for R's XDR serialization (R Internals, "Serialization Formats") ---
void put_i32(std::string* out, int64_t v) {
  const auto u = static_cast<uint32_t>(v);
  for (int s = 24; s >= 0; s -= 8) out->push_back(static_cast<char>((u >> s) & 0xFF));
}
std::string header() {
  std::string s = "X\n";
  put_i32(&s, 3);
  put_i32(&s, 0x00040201);  // written by R 4.2.1
  put_i32(&s, 0x00030500);  // readable by R >= 3.5.0
  put_i32(&s, 5);
  s += "UTF-8";
  return s;
}
constexpr int kAscii = 0x00040009, kUtf8 = 0x00008009, kLatin1 = 0x00004009;
void put_chars(std::string* out, const std::optional<std::string>& s, int flags = kAscii) {
  put_i32(out, flags);
  put_i32(out, s ? static_cast<int64_t>(s->size()) : -1);
  if (s) *out += *s;
}
struct Element {
  std::optional<std::string> text;  // nullopt = NA
  int flags = kAscii;
};
std::string character_vector(const std::vector<Element>& elements) {
  std::string s;
  put_i32(&s, 16);
  put_i32(&s, static_cast<int64_t>(elements.size()));
  for (const auto& e : elements) put_chars(&s, e.text, e.flags);
  return s;
}
std::string zlib_record(const std::string& serialized) {
  uLongf size = compressBound(serialized.size());
  std::string z(size, '\0');
  compress2(reinterpret_cast<Bytef*>(z.data()), &size,
            reinterpret_cast<const Bytef*>(serialized.data()), serialized.size(), 6);
  z.resize(size);
  std::string record;
  put_i32(&record, static_cast<int64_t>(serialized.size()));  // the *uncompressed* length
  return record + z;
}
std::string gzip(const std::string& data) {
  z_stream zs{};
  deflateInit2(&zs, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY);
  std::string out(deflateBound(&zs, data.size()) + 32, '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  zs.avail_in = static_cast<uInt>(data.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  deflate(&zs, Z_FINISH);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}
// The index R's makeLazyLoadDB writes: list(variables = list(name = c(offset, length), ...),
// references = list(), compressed = TRUE), serialized and gzip'd.
std::string rdx(const std::vector<std::tuple<std::string, int, int>>& vars) {
  std::string s = header();
  put_i32(&s, 19 | (1 << 9));  // VECSXP with attributes
  put_i32(&s, 3);
  put_i32(&s, 19 | (1 << 9));  // variables
  put_i32(&s, static_cast<int64_t>(vars.size()));
  for (const auto& [name, offset, length] : vars) {
    put_i32(&s, 13);
    put_i32(&s, 2);
    put_i32(&s, offset);
    put_i32(&s, length);
  }
  put_i32(&s, 2 | (1 << 10));  // attribute pairlist cell with tag
  put_i32(&s, 1);              // SYMSXP "names" (reference #1 from now on)
  put_chars(&s, std::string("names"));
  std::vector<Element> names;
  for (const auto& v : vars) names.push_back({std::get<0>(v)});
  s += character_vector(names);
  put_i32(&s, 254);
  put_i32(&s, 19);  // references = list()
  put_i32(&s, 0);
  put_i32(&s, 10);  // compressed = TRUE
  put_i32(&s, 1);
  put_i32(&s, 1);
  put_i32(&s, 2 | (1 << 10));
  put_i32(&s, (1 << 8) | 255);  // REFSXP #1 = names
  s += character_vector({{"variables"}, {"references"}, {"compressed"}});
  put_i32(&s, 254);
  return gzip(s);
}

const std::vector<Element> kFirst = {{"It is a truth"}, {std::nullopt}, {"caf\xC3\xA9", kUtf8}};
const std::vector<Element> kSecond = {{"Latin-1 \xE9t\xE9", kLatin1}, {""}};

TEST(RdataReader, ReadsRecordsBackToBackWithoutIndex) {
  TempDir dir;
  write_bytes(dir.file("Rdata.rdb"), zlib_record(header() + character_vector(kFirst)) +
                                         zlib_record(header() + character_vector(kSecond)));
  const auto objects = read_rdb_character_vectors(dir.file("Rdata.rdb"));
  ASSERT_EQ(objects.size(), 2u);
  EXPECT_EQ(objects[0], (std::vector<std::string>{"It is a truth", "", "caf\xC3\xA9"}));
  EXPECT_EQ(objects[1], (std::vector<std::string>{"Latin-1 \xC3\xA9t\xC3\xA9", ""}));
}

TEST(RdataReader, UsesIndexForNamesAndOrder) {
  TempDir dir;
  const std::string a = zlib_record(header() + character_vector(kFirst));
  const std::string b = zlib_record(header() + character_vector(kSecond));
  write_bytes(dir.file("Rdata.rdb"), a + b);
  // The index lists the second record first: the reader must follow it, not the file order.
  write_bytes(dir.file("Rdata.rdx"),
              rdx({{"beta", static_cast<int>(a.size()), static_cast<int>(b.size())},
                   {"alpha", 0, static_cast<int>(a.size())}}));
  const auto objects = read_rdb_named_character_vectors(dir.file("Rdata.rdb"));
  ASSERT_EQ(objects.size(), 2u);
  EXPECT_EQ(objects[0].name, "beta");
  EXPECT_EQ(objects[0].lines.size(), 2u);
  EXPECT_EQ(objects[1].name, "alpha");
  EXPECT_EQ(objects[1].lines[2], "caf\xC3\xA9");
}

TEST(RdataReader, AustenTextJoinsLinesAndBooks) {
  TempDir dir;
  const char* names[] = {"emma",       "mansfieldpark",  "northangerabbey",
                         "persuasion", "prideprejudice", "sensesensibility"};
  std::string db;
  std::vector<std::tuple<std::string, int, int>> index;
  for (int i = 0; i < 6; ++i) {
    const std::string record =
        zlib_record(header() + character_vector({{names[i]}, {std::nullopt}, {"end"}}));
    index.emplace_back(names[i], static_cast<int>(db.size()), static_cast<int>(record.size()));
    db += record;
  }
  write_bytes(dir.file("Rdata.rdb"), db);
  write_bytes(dir.file("Rdata.rdx"), rdx(index));
  // Lines joined by '\n' (the NA line is empty), books by a blank line, no final newline.
  std::string expected;
  for (int i = 0; i < 6; ++i) expected += std::string(i ? "\n\n" : "") + names[i] + "\n\nend";
  EXPECT_EQ(austen_corpus_text(dir.file("Rdata.rdb")), expected);
}

TEST(RdataReader, AustenTextRejectsOtherDatabases) {
  TempDir dir;
  write_bytes(dir.file("x.rdb"), zlib_record(header() + character_vector(kFirst)));
  EXPECT_THROW_WITH(austen_corpus_text(dir.file("x.rdb")), "expected the six novels");
}

TEST(RdataReader, TruncatedRecordNamesFileAndOffset) {
  TempDir dir;
  const std::string a = zlib_record(header() + character_vector(kFirst));
  const std::string b = zlib_record(header() + character_vector(kSecond));
  write_bytes(dir.file("bad.rdb"), a + b.substr(0, b.size() - 7));
  EXPECT_THROW_WITH(read_rdb_character_vectors(dir.file("bad.rdb")),
                    dir.file("bad.rdb") + ": record #1 at byte " + std::to_string(a.size()) +
                        ": compressed data is truncated");
}

TEST(RdataReader, CorruptStreamNamesFileAndOffset) {
  TempDir dir;
  std::string a = zlib_record(header() + character_vector(kFirst));
  a[a.size() / 2] ^= 0x55;
  a[a.size() / 2 + 1] ^= 0x55;
  write_bytes(dir.file("bad.rdb"), a);
  EXPECT_THROW_WITH(read_rdb_character_vectors(dir.file("bad.rdb")),
                    dir.file("bad.rdb") + ": record #0 at byte 0");
}

TEST(RdataReader, WrongObjectTypeIsReported) {
  TempDir dir;
  std::string ints = header();
  put_i32(&ints, 13);
  put_i32(&ints, 1);
  put_i32(&ints, 42);
  write_bytes(dir.file("ints.rdb"), zlib_record(ints));
  EXPECT_THROW_WITH(read_rdb_character_vectors(dir.file("ints.rdb")), "not a character vector");
}

TEST(RdataReader, ImpossibleLengthIsReported) {
  TempDir dir;
  std::string s = header();
  put_i32(&s, 16);
  put_i32(&s, 1000000);  // far more elements than bytes
  write_bytes(dir.file("len.rdb"), zlib_record(s));
  EXPECT_THROW_WITH(read_rdb_character_vectors(dir.file("len.rdb")),
                    "vector of 1000000 elements does not fit");
}

TEST(RdataReader, IndexPointingOutsideTheFileIsReported) {
  TempDir dir;
  write_bytes(dir.file("Rdata.rdb"), zlib_record(header() + character_vector(kFirst)));
  write_bytes(dir.file("Rdata.rdx"), rdx({{"ghost", 100000, 50}}));
  EXPECT_THROW_WITH(read_rdb_character_vectors(dir.file("Rdata.rdb")),
                    dir.file("Rdata.rdb") + ": record 'ghost' at byte 100000");
}

TEST(RdataReader, MissingFileIsNamed) {
  EXPECT_THROW_WITH(read_rdb_character_vectors("/nonexistent/Rdata.rdb"), "/nonexistent/Rdata.rdb");
}

// The real package, if its data was unpacked (scripts/fetch_corpus.sh keeps nothing, so point
// AUSTEN_RDB at an unpacked copy, or install the file at the Debian path).
TEST(RdataReader, RealJaneaustenrPackageGivesTheCorpusHash) {
  const char* env = std::getenv("AUSTEN_RDB");
  const std::string path = env && *env ? env : "/usr/lib/R/site-library/janeaustenr/data/Rdata.rdb";
  if (!std::filesystem::exists(path))
    GTEST_SKIP() << "no " << path << " (set AUSTEN_RDB to test it)";
  const std::string text = austen_corpus_text(path);
  EXPECT_EQ(text.size(), kAustenCorpusBytes);
  EXPECT_EQ(sha256_hex(text), kAustenCorpusSha256);
}

}  // namespace
}  // namespace deepspeed::examples
