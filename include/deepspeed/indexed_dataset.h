// DeepSpeed's MMapIndexedDataset files (Megatron's "mmap" format): PREFIX.bin holds the items'
// integers back to back, PREFIX.idx their element type, sizes, byte offsets and document starts.
// DeepSpeed's data analyzer writes its metric indexes in this format and its data sampler reads
// them and writes its curriculum clusters in it; the files here are byte-for-byte the ones
// DeepSpeed writes for the same items, and either side reads the other's.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace deepspeed::data_sampling {

/// The element types, by DeepSpeed's codes in the .idx header.
enum class IndexDtype : uint8_t {
  kUInt8 = 1,
  kInt8 = 2,
  kInt16 = 3,
  kInt32 = 4,
  kInt64 = 5,
  kUInt16 = 6,
  kUInt32 = 7,
  kUInt64 = 8,
};

/// Bytes per element.
size_t dtype_size(IndexDtype dtype);
const char* dtype_name(IndexDtype dtype);

/// DeepSpeed's find_fit_int_dtype: the narrowest type holding [min_value, max_value] (unsigned
/// when min_value >= 0).
IndexDtype fit_int_dtype(int64_t min_value, int64_t max_value);

/// Reads PREFIX.idx in full and the items from PREFIX.bin on demand. Errors name the file.
class MMapIndexedDataset {
 public:
  explicit MMapIndexedDataset(std::string prefix);
  ~MMapIndexedDataset();
  MMapIndexedDataset(MMapIndexedDataset&& other) noexcept;
  MMapIndexedDataset& operator=(MMapIndexedDataset&& other) noexcept;
  MMapIndexedDataset(const MMapIndexedDataset&) = delete;
  MMapIndexedDataset& operator=(const MMapIndexedDataset&) = delete;

  size_t size() const { return sizes_.size(); }
  IndexDtype dtype() const { return dtype_; }
  /// Item i's elements, widened to int64.
  std::vector<int64_t> item(size_t i) const;
  /// Elements [begin, end) of item i (end clipped to its size), as numpy's item[begin:end].
  std::vector<int64_t> item_slice(size_t i, size_t begin, size_t end) const;
  /// Item i's element count.
  size_t item_size(size_t i) const { return static_cast<size_t>(sizes_.at(i)); }
  const std::vector<int32_t>& sizes() const { return sizes_; }
  const std::vector<int64_t>& pointers() const { return pointers_; }
  const std::vector<int64_t>& doc_idx() const { return doc_idx_; }
  const std::string& prefix() const { return prefix_; }

 private:
  std::string prefix_;
  IndexDtype dtype_ = IndexDtype::kInt64;
  std::vector<int32_t> sizes_;
  std::vector<int64_t> pointers_;
  std::vector<int64_t> doc_idx_;
  std::FILE* bin_ = nullptr;
};

/// Writes PREFIX.bin item by item and PREFIX.idx at finalize (DeepSpeed's
/// MMapIndexedDatasetBuilder). Both files appear under their names only when finalize succeeds:
/// until then they are temporaries, so that a crash never leaves a half-written index.
class MMapIndexedDatasetBuilder {
 public:
  MMapIndexedDatasetBuilder(std::string prefix, IndexDtype dtype);
  ~MMapIndexedDatasetBuilder();
  MMapIndexedDatasetBuilder(const MMapIndexedDatasetBuilder&) = delete;
  MMapIndexedDatasetBuilder& operator=(const MMapIndexedDatasetBuilder&) = delete;

  /// Appends one item, each value converted to the builder's type (checked to fit).
  void add_item(const std::vector<int64_t>& values);
  /// Marks the end of a document (DeepSpeed's end_document).
  void end_document();
  /// Appends the items of another dataset of the same type (DeepSpeed's merge_file_).
  void merge_file(const std::string& other_prefix);
  /// Writes the index; with `close_document`, ends a document first, as DeepSpeed's
  /// close_mmap_dataset_builder does.
  void finalize(bool close_document = true);

 private:
  std::string prefix_;
  IndexDtype dtype_;
  std::vector<int32_t> sizes_;
  std::vector<int64_t> doc_idx_{0};
  std::FILE* bin_ = nullptr;
  bool finalized_ = false;
};

/// One call for a whole dataset: the items, then end_document and the index (DeepSpeed's
/// create_mmap_dataset_builder, add_item per item, close_mmap_dataset_builder).
void write_indexed_dataset(const std::string& prefix, IndexDtype dtype,
                           const std::vector<std::vector<int64_t>>& items);

}  // namespace deepspeed::data_sampling
