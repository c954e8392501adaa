// A GGUF file (llama.cpp's single-file model format, versions 2 and 3): header, metadata,
// tensor table and alignment, read without ggml. Owns parsing and validation of the layout and
// reading one tensor's bytes; the block formats are decoded in gguf_dequantize.h, and what the
// tensors mean for a model (names, layouts) is llama_weights.h's business.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "deepspeed/errors.h"

namespace deepspeed::examples {

/// A model file (GGUF or Hugging Face folder) that is missing, truncated or inconsistent. The
/// message names the file and the field or tensor, what was expected and what was found.
class ModelFileError : public Error {
 public:
  using Error::Error;
};

/// ggml's tensor type ids (ggml.h's enum ggml_type) for the types this reader decodes.
enum class GgufType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q8_0 = 8,
  BF16 = 30,
};

/// One row of the tensor table.
struct GgufTensorInfo {
  std::string name;
  /// Torch order (slowest dimension first): GGUF lists ne[0] (the contiguous one) first, so
  /// this is GGUF's dims reversed; token_embd.weight [576, 49152] in GGUF is [49152, 576] here.
  std::vector<int64_t> shape;
  uint32_t type = 0;             // ggml type id (GgufType when known)
  uint64_t offset = 0;           // of the data, from the start of the file (already aligned)
  uint64_t nbytes = 0;           // of the data as stored (blocks included)
  int64_t numel() const;
};

class GgufFile {
 public:
  /// Reads and checks the header, metadata and tensor table of `path` (not the tensor data):
  /// magic "GGUF", version 2 or 3, every string, array and tensor info complete, offsets
  /// aligned to general.alignment (default 32), every tensor's data inside the file, and each
  /// tensor's type known to this reader. Throws ModelFileError naming the file and the field
  /// or tensor on any violation (a truncated file names what was being read when it ended).
  static GgufFile open(const std::string& path);

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  /// Every key/value pair: integers and floats as JSON numbers, bools, strings (raw bytes),
  /// arrays as JSON arrays.
  const nlohmann::json& metadata() const { return metadata_; }
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }

  bool has(const std::string& key) const { return metadata_.contains(key); }
  /// Typed metadata access; a missing key or one of another type throws ModelFileError naming
  /// the file and the key.
  int64_t get_int(const std::string& key) const;
  double get_float(const std::string& key) const;
  std::string get_string(const std::string& key) const;
  const nlohmann::json& get_array(const std::string& key) const;

  /// The table row of `name`, or nullptr.
  const GgufTensorInfo* find_tensor(const std::string& name) const;
  /// The tensor `name` decoded to `dtype` (kFloat or kBFloat16), in torch order. Throws
  /// ModelFileError when absent or when the file cannot be read.
  at::Tensor load_tensor(const std::string& name, at::ScalarType dtype) const;

 private:
  std::string path_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  nlohmann::json metadata_;
  std::vector<GgufTensorInfo> tensors_;
};

}  // namespace deepspeed::examples
