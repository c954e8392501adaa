// The zip reader behind load(): the central directory (zip64 included), local header checks,
// stored and deflated records, CRC-32 on every read. See Note [Zip checks] in zip_reader.h.
// Writing stays with LibTorch's PyTorchStreamWriter (torch_file.cpp).
#include "runtime/checkpoint/zip_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "deepspeed/errors.h"
#include "util/check.h"

namespace deepspeed::checkpoint::detail {
namespace {

constexpr uint32_t kLocalHeaderSig = 0x04034b50;
constexpr uint32_t kCentralHeaderSig = 0x02014b50;
constexpr uint32_t kEndSig = 0x06054b50;
constexpr uint32_t kEnd64Sig = 0x06064b50;
constexpr uint32_t kEnd64LocatorSig = 0x07064b50;
constexpr size_t kEndSize = 22, kEnd64Size = 56, kEnd64LocatorSize = 20;
constexpr size_t kCentralHeaderSize = 46, kLocalHeaderSize = 30;
constexpr uint16_t kFlagEncrypted = 1, kFlagDataDescriptor = 8;
constexpr uint32_t kZip64Marker = 0xffffffff;
constexpr size_t kChunkBytes = size_t{16} << 20;  // read and CRC in 16 MiB pieces

const char* const kDamaged =
    " (the file is truncated or corrupted: a save that was interrupted, or bytes changed on disk "
    "or in transfer; use another copy or the previous checkpoint tag)";

uint16_t u16(const unsigned char* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
uint32_t u32(const unsigned char* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}
uint64_t u64(const unsigned char* p) { return u32(p) | (static_cast<uint64_t>(u32(p + 4)) << 32); }

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

std::string method_name(uint16_t method) {
  return method == 0 ? "stored" : method == 8 ? "deflated" : "method " + std::to_string(method);
}

}  // namespace

template <typename... Parts>
void ZipReader::fail(const Parts&... parts) const {
  throw CheckpointError(::deepspeed::detail::str_cat(source_, ": ", parts...));
}

ZipReader::ZipReader(uint64_t file_size, ReadAt read_at, std::string source)
    : file_size_(file_size), read_at_(std::move(read_at)), source_(std::move(source)) {
  read_directory();
  for (auto& record : records_) check_local_header(record);
  check_layout();
}

ZipReader ZipReader::open_file(const std::string& path) {
  const int raw_fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  DS_CHECK(raw_fd >= 0, CheckpointError, path, ": cannot open: ", std::strerror(errno));
  auto fd = std::shared_ptr<int>(new int(raw_fd), [](int* p) {
    ::close(*p);
    delete p;
  });
  struct stat st {};
  DS_CHECK(::fstat(*fd, &st) == 0, CheckpointError, path, ": cannot stat: ", std::strerror(errno));
  auto read_at = [fd, path](uint64_t offset, void* dst, size_t count) {
    auto* out = static_cast<char*>(dst);
    while (count > 0) {
      const ssize_t n = ::pread(*fd, out, count, static_cast<off_t>(offset));
      if (n < 0 && errno == EINTR) continue;
      DS_CHECK(n >= 0, CheckpointError, path, ": read failed at byte ", offset, ": ",
               std::strerror(errno));
      DS_CHECK(n > 0, CheckpointError, path, ": the file ended at byte ", offset,
               " while reading (did it shrink while being read?)");
      out += n;
      offset += static_cast<uint64_t>(n);
      count -= static_cast<size_t>(n);
    }
  };
  return ZipReader(static_cast<uint64_t>(st.st_size), read_at, path);
}

ZipReader ZipReader::open_memory(const std::string& bytes, std::string source) {
  const std::string* data = &bytes;
  auto read_at = [data](uint64_t offset, void* dst, size_t count) {
    DS_INTERNAL_ASSERT(offset <= data->size() && count <= data->size() - offset);
    std::memcpy(dst, data->data() + offset, count);
  };
  return ZipReader(bytes.size(), read_at, std::move(source));
}

void ZipReader::read_directory() {
  // The end record is the last thing in the file, followed only by a comment (<= 64 KiB).
  const uint64_t tail_size = std::min<uint64_t>(file_size_, kEndSize + 0xffff);
  std::vector<unsigned char> tail(tail_size);
  read_at_(file_size_ - tail_size, tail.data(), tail_size);
  int64_t end_at = -1;  // within tail
  for (int64_t i = static_cast<int64_t>(tail_size) - static_cast<int64_t>(kEndSize); i >= 0; --i) {
    const unsigned char* p = tail.data() + i;
    if (u32(p) == kEndSig && static_cast<uint64_t>(i) + kEndSize + u16(p + 20) <= tail_size) {
      end_at = i;
      break;
    }
  }
  if (end_at < 0) fail("no zip end-of-central-directory record", kDamaged);
  const unsigned char* end = tail.data() + end_at;
  const uint64_t end_offset = file_size_ - tail_size + static_cast<uint64_t>(end_at);
  if (u16(end + 4) != 0 || u16(end + 6) != 0) fail("multi-part zip archives are not supported");
  uint64_t entries = u16(end + 10);
  uint64_t directory_size = u32(end + 12);
  directory_offset_ = u32(end + 16);
  uint64_t directory_end = end_offset;
  if (end_offset >= kEnd64LocatorSize) {
    unsigned char locator[kEnd64LocatorSize];
    read_at_(end_offset - kEnd64LocatorSize, locator, kEnd64LocatorSize);
    if (u32(locator) == kEnd64LocatorSig) {  // zip64: the 64-bit end record has the truth
      const uint64_t end64_offset = u64(locator + 8);
      if (end64_offset > end_offset - kEnd64LocatorSize ||
          end_offset - kEnd64LocatorSize - end64_offset < kEnd64Size) {
        fail("the zip64 end record offset ", end64_offset, " is outside the file", kDamaged);
      }
      unsigned char end64[kEnd64Size];
      read_at_(end64_offset, end64, kEnd64Size);
      if (u32(end64) != kEnd64Sig) fail("no zip64 end record at byte ", end64_offset, kDamaged);
      entries = u64(end64 + 32);
      directory_size = u64(end64 + 40);
      directory_offset_ = u64(end64 + 48);
      directory_end = end64_offset;
    }
  }
  if (directory_offset_ > directory_end || directory_size > directory_end - directory_offset_) {
    fail("the zip central directory (", directory_size, " bytes at byte ", directory_offset_,
         ") does not fit before its end record at byte ", directory_end, kDamaged);
  }
  if (entries > directory_size / kCentralHeaderSize) {
    fail("the zip directory claims ", entries, " records in ", directory_size, " bytes", kDamaged);
  }
  if (entries == 0) fail("the zip archive holds no records");

  std::vector<unsigned char> dir(directory_size);
  read_at_(directory_offset_, dir.data(), directory_size);
  size_t at = 0;
  records_.reserve(entries);
  for (uint64_t i = 0; i < entries; ++i) {
    if (directory_size - at < kCentralHeaderSize || u32(dir.data() + at) != kCentralHeaderSig) {
      fail("zip directory entry ", i, " at byte ", directory_offset_ + at, " is malformed",
           kDamaged);
    }
    const unsigned char* h = dir.data() + at;
    const uint16_t flags = u16(h + 8);
    ZipRecord r;
    r.method = u16(h + 10);
    r.crc32 = u32(h + 16);
    r.compressed_size = u32(h + 20);
    r.size = u32(h + 24);
    const size_t name_len = u16(h + 28), extra_len = u16(h + 30), comment_len = u16(h + 32);
    r.header_offset = u32(h + 42);
    if (directory_size - at - kCentralHeaderSize < name_len + extra_len + comment_len) {
      fail("zip directory entry ", i, " runs past the directory", kDamaged);
    }
    r.name.assign(reinterpret_cast<const char*>(h + kCentralHeaderSize), name_len);
    // zip64 extended information: the 64-bit values of the fields set to 0xffffffff, in order.
    const unsigned char* extra = h + kCentralHeaderSize + name_len;
    for (size_t e = 0; e + 4 <= extra_len;) {
      const uint16_t id = u16(extra + e), len = u16(extra + e + 2);
      if (e + 4 + len > extra_len) fail("zip record '", r.name, "': malformed extra field", kDamaged);
      if (id == 0x0001) {
        size_t f = e + 4;
        for (uint64_t* field : {&r.size, &r.compressed_size, &r.header_offset}) {
          if (*field != kZip64Marker) continue;
          if (f + 8 > e + 4 + len) fail("zip record '", r.name, "': short zip64 field", kDamaged);
          *field = u64(extra + f);
          f += 8;
        }
      }
      e += 4 + len;
    }
    if (flags & kFlagEncrypted) fail("zip record '", r.name, "' is encrypted; not supported");
    if (r.method != 0 && r.method != 8) {
      fail("zip record '", r.name, "' uses compression ", method_name(r.method),
           "; only stored and deflated records are read");
    }
    if (r.method == 0 && r.compressed_size != r.size) {
      fail("zip record '", r.name, "' is stored but its sizes differ (", r.compressed_size,
           " stored bytes, ", r.size, " declared)", kDamaged);
    }
    // Note [Zip checks]: no allocation larger than the compressed bytes can inflate to.
    if (r.method == 8 && r.size > r.compressed_size * kMaxDeflateRatio + 1024) {
      fail("zip record '", r.name, "' declares ", r.size, " bytes from ", r.compressed_size,
           " compressed bytes, more than deflate can produce (at most ", kMaxDeflateRatio,
           ":1); refusing to allocate it", kDamaged);
    }
    records_.push_back(std::move(r));
    at += kCentralHeaderSize + name_len + extra_len + comment_len;
  }

  // LibTorch's rule: the first record's folder is the archive's.
  const std::string& first = records_.front().name;
  const size_t slash = first.find('/');
  if (slash == std::string::npos) {
    fail("zip record '", first, "' is not in a folder, so this is not a torch.save archive");
  }
  archive_name_ = first.substr(0, slash);
  const std::string prefix = archive_name_ + "/";
  for (size_t i = 0; i < records_.size(); ++i) {
    const std::string& name = records_[i].name;
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    if (!index_.emplace(name.substr(prefix.size()), i).second) {
      fail("zip record '", name, "' appears twice", kDamaged);
    }
  }
}

void ZipReader::check_local_header(ZipRecord& r) const {
  if (r.header_offset > directory_offset_ ||
      directory_offset_ - r.header_offset < kLocalHeaderSize + r.name.size()) {
    fail("zip record '", r.name, "': local header at byte ", r.header_offset,
         " is outside the data area", kDamaged);
  }
  std::vector<unsigned char> h(kLocalHeaderSize + r.name.size());
  read_at_(r.header_offset, h.data(), h.size());
  if (u32(h.data()) != kLocalHeaderSig) {
    fail("zip record '", r.name, "': no local header at byte ", r.header_offset, kDamaged);
  }
  const uint16_t flags = u16(h.data() + 6), method = u16(h.data() + 8);
  const size_t name_len = u16(h.data() + 26), extra_len = u16(h.data() + 28);
  const std::string name(reinterpret_cast<const char*>(h.data() + kLocalHeaderSize),
                         std::min(name_len, r.name.size()));
  if (name_len != r.name.size() || name != r.name || method != r.method) {
    fail("zip record '", r.name, "': the local header (name '", name, "', ", method_name(method),
         ") disagrees with the central directory (", method_name(r.method), ")", kDamaged);
  }
  if (!(flags & kFlagDataDescriptor)) {  // else the local fields are zero and a descriptor follows
    const uint32_t crc = u32(h.data() + 14), compressed = u32(h.data() + 18),
                   size = u32(h.data() + 22);
    const bool sizes_match = (compressed == kZip64Marker || compressed == r.compressed_size) &&
                             (size == kZip64Marker || size == r.size);
    if (crc != r.crc32 || !sizes_match) {
      fail("zip record '", r.name, "': the local header (CRC-32 ", hex32(crc), ", ", compressed,
           " -> ", size, " bytes) disagrees with the central directory (CRC-32 ", hex32(r.crc32),
           ", ", r.compressed_size, " -> ", r.size, " bytes)", kDamaged);
    }
  }
  r.data_offset = r.header_offset + kLocalHeaderSize + name_len + extra_len;
  if (r.data_offset > directory_offset_ || r.compressed_size > directory_offset_ - r.data_offset) {
    fail("zip record '", r.name, "': its ", r.compressed_size, " bytes at byte ", r.data_offset,
         " run past the data area (", directory_offset_, " bytes)", kDamaged);
  }
}

// Records may not share bytes: overlapping records are how a small file can stand for
// unbounded data, and no zip writer produces them.
void ZipReader::check_layout() {
  std::vector<const ZipRecord*> by_offset;
  for (const auto& r : records_) by_offset.push_back(&r);
  std::sort(by_offset.begin(), by_offset.end(), [](const ZipRecord* a, const ZipRecord* b) {
    return a->header_offset < b->header_offset;
  });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const ZipRecord& prev = *by_offset[i - 1];
    if (prev.data_offset + prev.compressed_size > by_offset[i]->header_offset) {
      fail("zip records '", prev.name, "' and '", by_offset[i]->name, "' overlap", kDamaged);
    }
  }
}

const ZipRecord* ZipReader::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &records_[it->second];
}

c10::DataPtr ZipReader::read(const ZipRecord& r) const {
  c10::DataPtr out = c10::GetCPUAllocator()->allocate(r.size);
  auto* dst = static_cast<unsigned char*>(out.get());
  uLong crc = crc32_z(0, nullptr, 0);
  if (r.method == 0) {
    for (uint64_t done = 0; done < r.size;) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(kChunkBytes, r.size - done));
      read_at_(r.data_offset + done, dst + done, n);
      crc = crc32_z(crc, dst + done, n);
      done += n;
    }
  } else {
    z_stream zs{};
    if (inflateInit2(&zs, -MAX_WBITS) != Z_OK) fail("zip record '", r.name, "': inflateInit failed");
    std::unique_ptr<z_stream, int (*)(z_stream*)> guard(&zs, inflateEnd);
    std::vector<unsigned char> in(static_cast<size_t>(std::min<uint64_t>(kChunkBytes, r.compressed_size)));
    uint64_t in_done = 0, out_done = 0;
    unsigned char spill = 0;  // where output beyond the declared size would go
    while (true) {
      if (zs.avail_in == 0 && in_done < r.compressed_size) {
        const size_t n = static_cast<size_t>(std::min<uint64_t>(in.size(), r.compressed_size - in_done));
        read_at_(r.data_offset + in_done, in.data(), n);
        in_done += n;
        zs.next_in = in.data();
        zs.avail_in = static_cast<uInt>(n);
      }
      const uint64_t room = r.size - out_done;
      zs.next_out = room == 0 ? &spill : dst + out_done;
      zs.avail_out = room == 0 ? 1u : static_cast<uInt>(std::min<uint64_t>(room, uint64_t{1} << 30));
      const uInt before = zs.avail_out;
      const int ret = inflate(&zs, Z_NO_FLUSH);
      const uInt produced = before - zs.avail_out;
      if (room == 0 && produced > 0) {
        fail("zip record '", r.name, "' inflates to more than its declared ", r.size,
             " bytes; stopped there", kDamaged);
      }
      if (room > 0) crc = crc32_z(crc, dst + out_done, produced);
      out_done += room > 0 ? produced : 0;
      if (ret == Z_STREAM_END) break;
      if (ret == Z_BUF_ERROR && zs.avail_in == 0 && in_done == r.compressed_size) {
        fail("zip record '", r.name, "': its deflate stream ends early (", out_done, " of ",
             r.size, " bytes)", kDamaged);
      }
      if (ret != Z_OK && ret != Z_BUF_ERROR) {
        fail("zip record '", r.name, "': inflate failed: ", zs.msg ? zs.msg : "error",
             kDamaged);
      }
    }
    if (out_done != r.size) {
      fail("zip record '", r.name, "' inflates to ", out_done, " bytes, its directory entry says ",
           r.size, kDamaged);
    }
  }
  if (static_cast<uint32_t>(crc) != r.crc32) {
    fail("zip record '", r.name, "': CRC-32 of the data is ", hex32(static_cast<uint32_t>(crc)),
         ", the zip directory says ", hex32(r.crc32), kDamaged);
  }
  return out;
}

}  // namespace deepspeed::checkpoint::detail
