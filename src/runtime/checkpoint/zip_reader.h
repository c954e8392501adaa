// ZipReader: the records of a torch.save zip archive, read with every check a damaged or
// hostile file needs before it can cost memory or hand back wrong bytes. See Note [Zip checks].
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

namespace deepspeed::checkpoint::detail {

// Note [Zip checks]
// LibTorch's own reader (miniz built without CRC checks) loads a file with flipped bytes
// silently and allocates whatever size a record declares. This reader, before handing out a
// byte, checks: the end-of-central-directory record (zip64 too), every central directory
// entry against its local header (signature, name, method, CRC and sizes unless a data
// descriptor follows), that record data lies inside the file without overlapping another
// record, that a stored record's sizes agree and a deflated one declares at most
// kMaxDeflateRatio times its compressed size; when reading, that the bytes match the CRC-32,
// and that a deflated record inflates to exactly its declared size (inflating stops there).
// Every failure is a CheckpointError naming the file and the record.

/// Deflate's largest expansion (258-byte matches coded in about 2 bits: 1032:1).
inline constexpr uint64_t kMaxDeflateRatio = 1032;

struct ZipRecord {
  std::string name;  // full name in the archive, "<archive>/data/0"
  uint16_t method = 0;  // 0 stored, 8 deflated
  uint32_t crc32 = 0;
  uint64_t compressed_size = 0;
  uint64_t size = 0;  // uncompressed
  uint64_t header_offset = 0;  // of the local header
  uint64_t data_offset = 0;  // of the (compressed) data
};

class ZipReader {
 public:
  /// Reads `count` bytes at `offset` into `dst`; throws on a short read.
  using ReadAt = std::function<void(uint64_t offset, void* dst, size_t count)>;

  /// An archive of `file_size` bytes read through `read_at`; `source` names it in errors.
  /// Parses and checks the directory (Note [Zip checks]); throws CheckpointError.
  ZipReader(uint64_t file_size, ReadAt read_at, std::string source);
  /// The archive in a file.
  static ZipReader open_file(const std::string& path);
  /// The archive in memory; `bytes` must outlive the reader.
  static ZipReader open_memory(const std::string& bytes, std::string source);

  /// The folder every torch.save record sits in (the first record's, as LibTorch decides).
  const std::string& archive_name() const { return archive_name_; }
  /// `name` is relative to the archive folder ("data.pkl", "data/0").
  const ZipRecord* find(const std::string& name) const;
  bool has_record(const std::string& name) const { return find(name) != nullptr; }
  const std::vector<ZipRecord>& records() const { return records_; }
  /// The record's bytes, CRC-checked (64-byte aligned CPU memory from LibTorch's allocator).
  c10::DataPtr read(const ZipRecord& record) const;

 private:
  void read_directory();
  void check_local_header(ZipRecord& record) const;
  void check_layout();
  template <typename... Parts>
  [[noreturn]] void fail(const Parts&... parts) const;

  uint64_t file_size_;
  ReadAt read_at_;
  std::string source_;
  uint64_t directory_offset_ = 0;
  std::vector<ZipRecord> records_;
  std::map<std::string, size_t> index_;  // name within the archive folder -> records_ index
  std::string archive_name_;
};

}  // namespace deepspeed::checkpoint::detail
