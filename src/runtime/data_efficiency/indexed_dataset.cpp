// DeepSpeed's MMapIndexedDataset format. The .idx layout (little-endian): the 9-byte magic
// "MMIDIDX\0\0", u64 version 1, u8 dtype code, u64 item count, u64 document-index length, then
// the int32 sizes, the int64 byte offsets (an exclusive scan of size * element bytes) and the
// int64 document index.
#include "deepspeed/indexed_dataset.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "util/check.h"

namespace deepspeed::data_sampling {
namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr uint64_t kVersion = 1;

std::string idx_path(const std::string& prefix) { return prefix + ".idx"; }
std::string bin_path(const std::string& prefix) { return prefix + ".bin"; }

std::FILE* open_or_throw(const std::string& path, const char* mode, const char* what) {
  std::FILE* f = std::fopen(path.c_str(), mode);
  DS_CHECK(f != nullptr, UsageError, "cannot open ", what, " ", path, ": ",
           std::strerror(errno));
  return f;
}

template <typename T>
void read_exact(std::FILE* f, T* out, size_t count, const std::string& path) {
  DS_CHECK(std::fread(out, sizeof(T), count, f) == count, UsageError, path,
           ": truncated (not an MMapIndexedDataset index, or cut short)");
}

template <typename T>
void write_exact(std::FILE* f, const T* data, size_t count, const std::string& path) {
  DS_CHECK(std::fwrite(data, sizeof(T), count, f) == count, UsageError, "writing ", path, ": ",
           std::strerror(errno));
}

bool valid_code(uint8_t code) { return code >= 1 && code <= 8; }

// Element `i` of a raw buffer of `dtype`, widened.
int64_t element(const unsigned char* raw, IndexDtype dtype, size_t i) {
  switch (dtype) {
    case IndexDtype::kUInt8: return raw[i];
    case IndexDtype::kInt8: return reinterpret_cast<const int8_t*>(raw)[i];
    case IndexDtype::kInt16: return reinterpret_cast<const int16_t*>(raw)[i];
    case IndexDtype::kInt32: return reinterpret_cast<const int32_t*>(raw)[i];
    case IndexDtype::kInt64: return reinterpret_cast<const int64_t*>(raw)[i];
    case IndexDtype::kUInt16: return reinterpret_cast<const uint16_t*>(raw)[i];
    case IndexDtype::kUInt32: return reinterpret_cast<const uint32_t*>(raw)[i];
    case IndexDtype::kUInt64:
      return static_cast<int64_t>(reinterpret_cast<const uint64_t*>(raw)[i]);
  }
  return 0;
}

template <typename T>
void put(std::vector<unsigned char>& out, int64_t v, const std::string& where) {
  DS_CHECK(v >= static_cast<int64_t>(std::numeric_limits<T>::min()) &&
               (v < 0 || static_cast<uint64_t>(v) <=
                             static_cast<uint64_t>(std::numeric_limits<T>::max())),
           UsageError, where, ": value ", v, " does not fit the dataset's element type");
  const T t = static_cast<T>(v);
  const auto* bytes = reinterpret_cast<const unsigned char*>(&t);
  out.insert(out.end(), bytes, bytes + sizeof(T));
}

}  // namespace

size_t dtype_size(IndexDtype dtype) {
  switch (dtype) {
    case IndexDtype::kUInt8:
    case IndexDtype::kInt8: return 1;
    case IndexDtype::kInt16:
    case IndexDtype::kUInt16: return 2;
    case IndexDtype::kInt32:
    case IndexDtype::kUInt32: return 4;
    case IndexDtype::kInt64:
    case IndexDtype::kUInt64: return 8;
  }
  return 8;
}

const char* dtype_name(IndexDtype dtype) {
  switch (dtype) {
    case IndexDtype::kUInt8: return "uint8";
    case IndexDtype::kInt8: return "int8";
    case IndexDtype::kInt16: return "int16";
    case IndexDtype::kInt32: return "int32";
    case IndexDtype::kInt64: return "int64";
    case IndexDtype::kUInt16: return "uint16";
    case IndexDtype::kUInt32: return "uint32";
    case IndexDtype::kUInt64: return "uint64";
  }
  return "?";
}

IndexDtype fit_int_dtype(int64_t min_value, int64_t max_value) {
  if (min_value >= 0) {
    if (max_value <= 255) return IndexDtype::kUInt8;
    if (max_value <= 65535) return IndexDtype::kUInt16;
    if (max_value <= 4294967295LL) return IndexDtype::kUInt32;
    return IndexDtype::kUInt64;
  }
  if (max_value <= 127 && min_value >= -128) return IndexDtype::kInt8;
  if (max_value <= 32767 && min_value >= -32768) return IndexDtype::kInt16;
  if (max_value <= 2147483647LL && min_value >= -2147483648LL) return IndexDtype::kInt32;
  return IndexDtype::kInt64;
}

// ---------------------------------------------------------------------------------------------
// reader

MMapIndexedDataset::MMapIndexedDataset(std::string prefix) : prefix_(std::move(prefix)) {
  const std::string path = idx_path(prefix_);
  std::FILE* f = open_or_throw(path, "rb", "index");
  try {
    char magic[9];
    read_exact(f, magic, 9, path);
    DS_CHECK(std::memcmp(magic, kMagic, 9) == 0, UsageError, path,
             ": not an MMapIndexedDataset index (its magic is not MMIDIDX)");
    uint64_t version = 0;
    read_exact(f, &version, 1, path);
    DS_CHECK(version == kVersion, UsageError, path, ": index version ", version,
             "; expected 1");
    uint8_t code = 0;
    read_exact(f, &code, 1, path);
    DS_CHECK(valid_code(code), UsageError, path, ": unknown element type code ",
             static_cast<int>(code));
    dtype_ = static_cast<IndexDtype>(code);
    uint64_t len = 0;
    uint64_t doc_count = 0;
    read_exact(f, &len, 1, path);
    read_exact(f, &doc_count, 1, path);
    // Sized against the file before allocating: a corrupt count must not ask for terabytes.
    DS_CHECK(std::fseek(f, 0, SEEK_END) == 0, UsageError, path, ": cannot seek");
    const uint64_t file_bytes = static_cast<uint64_t>(std::ftell(f));
    const uint64_t header = 9 + 8 + 1 + 8 + 8;
    DS_CHECK(len <= file_bytes && doc_count <= file_bytes &&
                 header + len * 12 + doc_count * 8 == file_bytes,
             UsageError, path, ": ", file_bytes, " bytes do not hold ", len, " items and ",
             doc_count, " document starts");
    std::fseek(f, static_cast<long>(header), SEEK_SET);
    sizes_.resize(len);
    pointers_.resize(len);
    doc_idx_.resize(doc_count);
    read_exact(f, sizes_.data(), len, path);
    read_exact(f, pointers_.data(), len, path);
    read_exact(f, doc_idx_.data(), doc_count, path);
  } catch (...) {
    std::fclose(f);
    throw;
  }
  std::fclose(f);
  bin_ = open_or_throw(bin_path(prefix_), "rb", "data file");
}

MMapIndexedDataset::~MMapIndexedDataset() {
  if (bin_ != nullptr) std::fclose(bin_);
}

MMapIndexedDataset::MMapIndexedDataset(MMapIndexedDataset&& other) noexcept
    : prefix_(std::move(other.prefix_)),
      dtype_(other.dtype_),
      sizes_(std::move(other.sizes_)),
      pointers_(std::move(other.pointers_)),
      doc_idx_(std::move(other.doc_idx_)),
      bin_(std::exchange(other.bin_, nullptr)) {}

MMapIndexedDataset& MMapIndexedDataset::operator=(MMapIndexedDataset&& other) noexcept {
  if (this != &other) {
    if (bin_ != nullptr) std::fclose(bin_);
    prefix_ = std::move(other.prefix_);
    dtype_ = other.dtype_;
    sizes_ = std::move(other.sizes_);
    pointers_ = std::move(other.pointers_);
    doc_idx_ = std::move(other.doc_idx_);
    bin_ = std::exchange(other.bin_, nullptr);
  }
  return *this;
}

std::vector<int64_t> MMapIndexedDataset::item(size_t i) const {
  return item_slice(i, 0, item_size(i));
}

std::vector<int64_t> MMapIndexedDataset::item_slice(size_t i, size_t begin, size_t end) const {
  DS_CHECK(i < size(), UsageError, prefix_, ": item ", i, " of ", size());
  end = std::min(end, item_size(i));
  if (begin >= end) return {};
  const size_t width = dtype_size(dtype_);
  std::vector<unsigned char> raw((end - begin) * width);
  const auto offset = static_cast<long>(pointers_[i] + static_cast<int64_t>(begin * width));
  const std::string path = bin_path(prefix_);
  DS_CHECK(std::fseek(bin_, offset, SEEK_SET) == 0, UsageError, path, ": cannot seek to item ",
           i);
  read_exact(bin_, raw.data(), raw.size(), path);
  std::vector<int64_t> out(end - begin);
  for (size_t k = 0; k < out.size(); ++k) out[k] = element(raw.data(), dtype_, k);
  return out;
}

// ---------------------------------------------------------------------------------------------
// builder

MMapIndexedDatasetBuilder::MMapIndexedDatasetBuilder(std::string prefix, IndexDtype dtype)
    : prefix_(std::move(prefix)), dtype_(dtype) {
  bin_ = open_or_throw(bin_path(prefix_) + ".tmp", "wb", "data file");
}

MMapIndexedDatasetBuilder::~MMapIndexedDatasetBuilder() {
  if (bin_ != nullptr) {
    std::fclose(bin_);
    std::remove((bin_path(prefix_) + ".tmp").c_str());
  }
}

void MMapIndexedDatasetBuilder::add_item(const std::vector<int64_t>& values) {
  std::vector<unsigned char> raw;
  raw.reserve(values.size() * dtype_size(dtype_));
  const std::string& where = prefix_;
  for (int64_t v : values) {
    switch (dtype_) {
      case IndexDtype::kUInt8: put<uint8_t>(raw, v, where); break;
      case IndexDtype::kInt8: put<int8_t>(raw, v, where); break;
      case IndexDtype::kInt16: put<int16_t>(raw, v, where); break;
      case IndexDtype::kInt32: put<int32_t>(raw, v, where); break;
      case IndexDtype::kInt64: put<int64_t>(raw, v, where); break;
      case IndexDtype::kUInt16: put<uint16_t>(raw, v, where); break;
      case IndexDtype::kUInt32: put<uint32_t>(raw, v, where); break;
      case IndexDtype::kUInt64: put<uint64_t>(raw, v, where); break;
    }
  }
  write_exact(bin_, raw.data(), raw.size(), bin_path(prefix_));
  DS_CHECK(values.size() <= static_cast<size_t>(std::numeric_limits<int32_t>::max()), UsageError,
           prefix_, ": an item of ", values.size(), " elements (the format's sizes are int32)");
  sizes_.push_back(static_cast<int32_t>(values.size()));
}

void MMapIndexedDatasetBuilder::end_document() {
  doc_idx_.push_back(static_cast<int64_t>(sizes_.size()));
}

void MMapIndexedDatasetBuilder::merge_file(const std::string& other_prefix) {
  MMapIndexedDataset other(other_prefix);
  DS_CHECK(other.dtype() == dtype_, UsageError, other_prefix, ": element type ",
           dtype_name(other.dtype()), " cannot be merged into ", prefix_, " of ",
           dtype_name(dtype_));
  const auto offset = static_cast<int64_t>(sizes_.size());
  sizes_.insert(sizes_.end(), other.sizes().begin(), other.sizes().end());
  for (size_t k = 1; k < other.doc_idx().size(); ++k) {
    doc_idx_.push_back(offset + other.doc_idx()[k]);
  }
  std::FILE* in = open_or_throw(bin_path(other_prefix), "rb", "data file");
  std::vector<unsigned char> buf(1 << 20);
  for (size_t n; (n = std::fread(buf.data(), 1, buf.size(), in)) > 0;) {
    write_exact(bin_, buf.data(), n, bin_path(prefix_));
  }
  std::fclose(in);
}

void MMapIndexedDatasetBuilder::finalize(bool close_document) {
  DS_CHECK(!finalized_, UsageError, prefix_, ": finalized twice");
  if (close_document) end_document();
  const std::string bin = bin_path(prefix_);
  const std::string idx = idx_path(prefix_);
  DS_CHECK(std::fflush(bin_) == 0 && std::fclose(bin_) == 0, UsageError, "writing ", bin, ": ",
           std::strerror(errno));
  bin_ = nullptr;
  std::FILE* f = open_or_throw(idx + ".tmp", "wb", "index");
  const uint8_t code = static_cast<uint8_t>(dtype_);
  const uint64_t len = sizes_.size();
  const uint64_t docs = doc_idx_.size();
  std::vector<int64_t> pointers(sizes_.size());
  int64_t at = 0;
  for (size_t i = 0; i < sizes_.size(); ++i) {
    pointers[i] = at;
    at += static_cast<int64_t>(sizes_[i]) * static_cast<int64_t>(dtype_size(dtype_));
  }
  write_exact(f, kMagic, 9, idx);
  write_exact(f, &kVersion, 1, idx);
  write_exact(f, &code, 1, idx);
  write_exact(f, &len, 1, idx);
  write_exact(f, &docs, 1, idx);
  write_exact(f, sizes_.data(), sizes_.size(), idx);
  write_exact(f, pointers.data(), pointers.size(), idx);
  write_exact(f, doc_idx_.data(), doc_idx_.size(), idx);
  DS_CHECK(std::fflush(f) == 0 && std::fclose(f) == 0, UsageError, "writing ", idx, ": ",
           std::strerror(errno));
  // The data first, then the index that describes it: a reader finding the index finds its data.
  DS_CHECK(std::rename((bin + ".tmp").c_str(), bin.c_str()) == 0, UsageError, "renaming ", bin,
           ".tmp: ", std::strerror(errno));
  DS_CHECK(std::rename((idx + ".tmp").c_str(), idx.c_str()) == 0, UsageError, "renaming ", idx,
           ".tmp: ", std::strerror(errno));
  finalized_ = true;
}

void write_indexed_dataset(const std::string& prefix, IndexDtype dtype,
                           const std::vector<std::vector<int64_t>>& items) {
  MMapIndexedDatasetBuilder builder(prefix, dtype);
  for (const auto& item : items) builder.add_item(item);
  builder.finalize();
}

}  // namespace deepspeed::data_sampling
