// The zip layer of load() (Note [Zip checks]): flipped bytes anywhere in a saved checkpoint
// never load silently, CRC errors name the file and the record, deflated records inflate to
// exactly their declared size, implausible sizes are refused before allocating, and storage
// records are checked against the tensor metadata before they are read. Archives are built
// here by hand (build_zip) to hold what no torch.save writes.
#include <zlib.h>

#include <cstring>
#include <fstream>
#include <iostream>
#include <optional>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "deepspeed/checkpoint.h"
#include "support/expect_throw.h"
#include "support/temp_dir.h"

namespace deepspeed::checkpoint {
namespace {

using c10::IValue;

void put16(std::string& s, uint32_t v) {
  s.push_back(static_cast<char>(v & 0xff));
  s.push_back(static_cast<char>((v >> 8) & 0xff));
}
void put32(std::string& s, uint32_t v) {
  put16(s, v & 0xffff);
  put16(s, v >> 16);
}

std::string raw_deflate(const std::string& data) {
  z_stream zs{};
  EXPECT_EQ(deflateInit2(&zs, 9, Z_DEFLATED, -MAX_WBITS, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::string out(deflateBound(&zs, data.size()), '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  zs.avail_in = static_cast<uInt>(data.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&zs, Z_FINISH), Z_STREAM_END);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

struct TestRecord {
  std::string name;
  std::string data;
  bool deflate = false;
  std::optional<uint32_t> declared_size;  // what the headers claim; the true size by default
  std::optional<std::string> local_name;  // the local header's name; `name` by default
};

void put64(std::string& s, uint64_t v) {
  put32(s, static_cast<uint32_t>(v));
  put32(s, static_cast<uint32_t>(v >> 32));
}

// A zip archive whose headers say what the records ask for. With `zip64`, every size and
// offset goes through the zip64 fields, as writers do for files over 4 GiB.
std::string build_zip(const std::vector<TestRecord>& records, bool zip64 = false) {
  std::string out, directory;
  for (const auto& r : records) {
    const std::string body = r.deflate ? raw_deflate(r.data) : r.data;
    const uint32_t crc = static_cast<uint32_t>(
        crc32(0, reinterpret_cast<const Bytef*>(r.data.data()), static_cast<uInt>(r.data.size())));
    const uint32_t size = r.declared_size.value_or(static_cast<uint32_t>(r.data.size()));
    auto fields = [&](std::string& s) {  // version needed .. uncompressed size
      put16(s, zip64 ? 45 : 20);
      put16(s, 0);
      put16(s, r.deflate ? 8 : 0);
      put32(s, 0);  // time, date
      put32(s, crc);
      put32(s, zip64 ? 0xffffffffu : static_cast<uint32_t>(body.size()));
      put32(s, zip64 ? 0xffffffffu : size);
    };
    const uint64_t offset = out.size();
    std::string extra;  // zip64 extended information: sizes (and, centrally, the offset)
    if (zip64) {
      put16(extra, 1);
      put16(extra, 16);
      put64(extra, size);
      put64(extra, body.size());
    }
    const std::string local_name = r.local_name.value_or(r.name);
    put32(out, 0x04034b50);
    fields(out);
    put16(out, static_cast<uint32_t>(local_name.size()));
    put16(out, static_cast<uint32_t>(extra.size()));
    out += local_name + extra + body;
    if (zip64) {
      extra[2] = 24;
      put64(extra, offset);
    }
    put32(directory, 0x02014b50);
    put16(directory, 20);  // made by
    fields(directory);
    put16(directory, static_cast<uint32_t>(r.name.size()));
    put16(directory, static_cast<uint32_t>(extra.size()));
    put16(directory, 0);  // comment length
    put32(directory, 0);  // disk, internal attributes
    put32(directory, 0);  // external attributes
    put32(directory, zip64 ? 0xffffffffu : static_cast<uint32_t>(offset));
    directory += r.name + extra;
  }
  const uint64_t directory_offset = out.size();
  out += directory;
  if (zip64) {
    const uint64_t end64_offset = out.size();
    put32(out, 0x06064b50);
    put64(out, 44);  // size of the rest of this record
    put32(out, (45 << 16) | 45);  // made by, needed
    put64(out, 0);  // disk numbers
    put64(out, records.size());
    put64(out, records.size());
    put64(out, directory.size());
    put64(out, directory_offset);
    put32(out, 0x07064b50);  // locator
    put32(out, 0);
    put64(out, end64_offset);
    put32(out, 1);
  }
  put32(out, 0x06054b50);
  put32(out, 0);
  put16(out, zip64 ? 0xffff : static_cast<uint32_t>(records.size()));
  put16(out, zip64 ? 0xffff : static_cast<uint32_t>(records.size()));
  put32(out, zip64 ? 0xffffffffu : static_cast<uint32_t>(directory.size()));
  put32(out, zip64 ? 0xffffffffu : static_cast<uint32_t>(directory_offset));
  put16(out, 0);
  return out;
}

const std::string kSevenPickle("\x80\x02K\x07.", 5);  // pickle.dumps(7, protocol=2)

// A torch.save-shaped pickle of one float tensor of 4 elements over storage "0", whose
// persistent id claims `numel` elements.
std::string tensor_pickle(int64_t numel) {
  auto str = [](const std::string& s) {
    std::string out = "X";
    put32(out, static_cast<uint32_t>(s.size()));
    return out + s;
  };
  std::string p = std::string("\x80\x02", 2) + "ctorch._utils\n_rebuild_tensor_v2\n((";
  p += str("storage") + "ctorch\nFloatStorage\n" + str("0") + str("cpu");
  p += std::string("\x8a\x08", 2);  // LONG1, 8 bytes
  for (int i = 0; i < 8; ++i) p.push_back(static_cast<char>((static_cast<uint64_t>(numel) >> (8 * i)) & 0xff));
  p += std::string("tQK\x00K\x04\x85K\x01\x85\x89", 11);  // storage, 0, (4,), (1,), False
  p += "ccollections\nOrderedDict\n)Rt" "R.";
  return p;
}

std::string write(const testing::TempDir& dir, const std::string& name, const std::string& bytes) {
  std::ofstream(dir.file(name), std::ios::binary) << bytes;
  return dir.file(name);
}

TEST(ZipReader, ReadsStoredAndDeflatedRecords) {
  // Python's zipfile (and other writers) may deflate records; torch.save stores them. Files
  // over 4 GiB carry zip64 fields.
  for (bool zip64 : {false, true}) {
    for (bool deflate : {false, true}) {
      const std::string zip = build_zip(
          {{"archive/data.pkl", kSevenPickle, deflate}, {"archive/version", "3\n", deflate}}, zip64);
      EXPECT_EQ(load_from_string(zip).toInt(), 7) << deflate << zip64;
    }
  }
  const float values[4] = {1.5f, -2.f, 3.f, 4.25f};
  const std::string zip = build_zip({{"archive/data.pkl", tensor_pickle(4), true},
                                     {"archive/data/0", std::string(reinterpret_cast<const char*>(values), 16), true},
                                     {"archive/version", "3\n"}});
  EXPECT_TRUE(at::equal(load_from_string(zip).toTensor(), at::tensor({1.5f, -2.f, 3.f, 4.25f})));
  // ".data/version" is where torch >= 2.1 writes the format version.
  EXPECT_EQ(load_from_string(build_zip({{"archive/data.pkl", kSevenPickle},
                                        {"archive/.data/version", "3\n"}})).toInt(), 7);
  EXPECT_THROW_WITH(load_from_string(build_zip({{"archive/data.pkl", kSevenPickle},
                                                {"archive/version", "99\n"}})),
                    CheckpointError, "archive format version '99\n' is not one this LibTorch reads");
}

// Every single-bit flip anywhere in a saved checkpoint either fails with a CheckpointError or
// (in fields nothing depends on: timestamps, padding) loads the very same value.
TEST(ZipReader, AFlippedBitAnywhereNeverLoadsSilentlyWrongValues) {
  Dict d = new_dict();
  d.insert("w", at::arange(16, at::kFloat));
  d.insert("step", int64_t{3});
  d.insert("name", std::string("run"));
  const std::string good = save_to_string(IValue(d));
  int detected = 0, harmless = 0;
  for (size_t pos = 0; pos < good.size(); ++pos) {
    std::string bad = good;
    bad[pos] = static_cast<char>(bad[pos] ^ 0x01);
    try {
      IValue v = load_from_string(bad, "flipped.pt");
      auto back = v.toGenericDict();
      ASSERT_EQ(back.size(), 3u) << "byte " << pos;
      EXPECT_TRUE(at::equal(back.at("w").toTensor(), at::arange(16, at::kFloat))) << "byte " << pos;
      EXPECT_EQ(back.at("step").toInt(), 3) << "byte " << pos;
      EXPECT_EQ(back.at("name").toStringRef(), "run") << "byte " << pos;
      ++harmless;
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find("flipped.pt: "), std::string::npos) << e.what();
      ++detected;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "byte " << pos << ": not a CheckpointError: " << e.what();
    }
  }
  std::cout << good.size() << " bytes: " << detected << " flips detected, " << harmless
            << " harmless\n";
  EXPECT_GT(detected, static_cast<int>(good.size() / 2));
}

TEST(ZipReader, CorruptTensorDataNamesTheFileAndTheRecord) {
  testing::TempDir dir;
  Dict d = new_dict();
  d.insert("w", at::full({1000}, 10.6, at::kFloat));
  save(IValue(d), dir.file("model.pt"));
  std::string bytes;
  {
    std::ifstream in(dir.file("model.pt"), std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  const float value = 10.6f;
  const size_t pos = bytes.find(std::string(reinterpret_cast<const char*>(&value), 4));
  ASSERT_NE(pos, std::string::npos);
  bytes[pos + 3] = static_cast<char>(bytes[pos + 3] ^ 0x10);  // one 10.6 becomes 2.8e10
  const std::string path = write(dir, "model.pt", bytes);
  EXPECT_THROW_WITH(load(path), CheckpointError,
                    path + ": zip record 'archive/data/0': CRC-32 of the data is");
  EXPECT_THROW_WITH(load(path), CheckpointError, "the zip directory says");
}

TEST(ZipReader, ARecordInflatingPastItsDeclaredSizeIsStoppedThere) {
  testing::TempDir dir;
  const std::string data(100000, 'x');
  const std::string path = write(
      dir, "bomb.pt",
      build_zip({{"archive/data.pkl", data, true, /*declared_size=*/4096}, {"archive/version", "3\n"}}));
  EXPECT_THROW_WITH(load(path), CheckpointError,
                    path + ": zip record 'archive/data.pkl' inflates to more than its declared "
                           "4096 bytes");
  // Declared larger than the stream: it ends early.
  const std::string short_path = write(
      dir, "short.pt",
      build_zip({{"archive/data.pkl", kSevenPickle, true, /*declared_size=*/500}, {"archive/version", "3\n"}}));
  EXPECT_THROW_WITH(load(short_path), CheckpointError,
                    short_path + ": zip record 'archive/data.pkl' inflates to 5 bytes, its "
                                 "directory entry says 500");
}

TEST(ZipReader, AnImplausibleDeclaredSizeIsRefusedBeforeAllocating) {
  testing::TempDir dir;
  const std::string path = write(
      dir, "bomb.pt",
      build_zip({{"archive/data.pkl", std::string(1000, 'x'), true, /*declared_size=*/0xfffffff0u},
                 {"archive/version", "3\n"}}));
  EXPECT_THROW_WITH(load(path), CheckpointError,
                    path + ": zip record 'archive/data.pkl' declares 4294967280 bytes from");
  EXPECT_THROW_WITH(load(path), CheckpointError, "more than deflate can produce");
  // A stored record's sizes must agree.
  EXPECT_THROW_WITH(load_from_string(build_zip({{"archive/data.pkl", kSevenPickle, false, 1u << 30},
                                                {"archive/version", "3\n"}})),
                    CheckpointError, "is stored but its sizes differ");
}

TEST(ZipReader, TheLocalHeaderMustAgreeWithTheDirectory) {
  TestRecord pickle{"archive/data.pkl", kSevenPickle};
  pickle.local_name = "archive/data.pkX";
  EXPECT_THROW_WITH(load_from_string(build_zip({pickle, {"archive/version", "3\n"}}), "x.pt"),
                    CheckpointError,
                    "x.pt: zip record 'archive/data.pkl': the local header (name "
                    "'archive/data.pkX', stored) disagrees with the central directory");
}

TEST(ZipReader, StorageRecordSizeIsCheckedAgainstTheTensorBeforeReading) {
  const std::string values(16, '\0');
  auto archive = [&](int64_t numel) {
    return build_zip({{"archive/data.pkl", tensor_pickle(numel)},
                      {"archive/data/0", values},
                      {"archive/version", "3\n"}});
  };
  EXPECT_EQ(load_from_string(archive(4)).toTensor().numel(), 4);
  EXPECT_THROW_WITH(load_from_string(archive(int64_t{1} << 50), "t.pt"), CheckpointError,
                    "t.pt: tensor data record 'data/0' holds 16 bytes, the pickle needs "
                    "4503599627370496");
  EXPECT_THROW_WITH(load_from_string(archive(-1), "t.pt"), CheckpointError,
                    "impossible element count -1");
}

TEST(ZipReader, DeeplyNestedPickleInAFileFailsNamingTheFile) {
  testing::TempDir dir;
  const int n = 1000000;  // 2 MB of nested lists
  const std::string pickle = "\x80\x02" + std::string(n, ']') + std::string(n - 1, 'a') + ".";
  const std::string path =
      write(dir, "deep.pt", build_zip({{"archive/data.pkl", pickle}, {"archive/version", "3\n"}}));
  EXPECT_THROW_WITH(load(path), CheckpointError, path + ": pickle data at byte ");
  EXPECT_THROW_WITH(load(path), CheckpointError, "values nested deeper than 1000 levels");
}

}  // namespace
}  // namespace deepspeed::checkpoint
