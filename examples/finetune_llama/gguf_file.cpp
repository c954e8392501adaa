// GGUF reader (see gguf_file.h). Layout, all little-endian:
//   "GGUF" u32 version, u64 tensor_count, u64 kv_count,
//   kv_count x (string key, u32 value type, value),
//   tensor_count x (string name, u32 n_dims, n_dims x u64 ne, u32 ggml type, u64 offset),
//   padding to `alignment`, then the data section; a tensor's offset is relative to it.
// Strings are u64 length + bytes; arrays are u32 element type, u64 count, elements.
#include "gguf_file.h"

#include <sys/stat.h>

#include <fstream>
#include <limits>

#include <ATen/ATen.h>

#include "gguf_dequantize.h"
#include "util/check.h"

namespace deepspeed::examples {
namespace {

// GGUF's metadata value types (gguf.h's enum gguf_type).
enum ValueType : uint32_t {
  kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7,
  kString = 8, kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12,
};

// Sequential reads that say what they were reading when the file ended.
class Cursor {
 public:
  Cursor(const std::string& path, uint64_t size) : path_(path), size_(size), in_(path, std::ios::binary) {
    DS_CHECK(in_.good(), ModelFileError, "GGUF file ", path, ": cannot open for reading");
  }
  void read(void* dst, uint64_t n, const std::string& what) {
    DS_CHECK(n <= size_ - pos_, ModelFileError, "GGUF file ", path_, " is truncated: it ends at byte ",
             size_, " while reading ", what, " (", n, " bytes at offset ", pos_, ")");
    in_.read(static_cast<char*>(dst), static_cast<std::streamsize>(n));
    DS_CHECK(in_.good(), ModelFileError, "GGUF file ", path_, ": read error at offset ", pos_,
             " while reading ", what);
    pos_ += n;
  }
  template <typename T>
  T pod(const std::string& what) {
    T v;
    read(&v, sizeof(T), what);
    return v;
  }
  std::string str(const std::string& what) {
    const auto n = pod<uint64_t>(what + " (string length)");
    std::string s(n <= size_ - pos_ ? n : 0, '\0');
    DS_CHECK(n <= size_ - pos_, ModelFileError, "GGUF file ", path_, " is truncated: ", what,
             " claims ", n, " bytes at offset ", pos_, " but the file ends at byte ", size_);
    read(s.data(), n, what);
    return s;
  }
  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }

 private:
  std::string path_;
  uint64_t size_;
  uint64_t pos_ = 0;
  std::ifstream in_;
};

nlohmann::json read_scalar(Cursor& c, uint32_t type, const std::string& what, const std::string& path) {
  switch (type) {
    case kU8: return c.pod<uint8_t>(what);
    case kI8: return c.pod<int8_t>(what);
    case kU16: return c.pod<uint16_t>(what);
    case kI16: return c.pod<int16_t>(what);
    case kU32: return c.pod<uint32_t>(what);
    case kI32: return c.pod<int32_t>(what);
    case kF32: return c.pod<float>(what);
    case kBool: return c.pod<uint8_t>(what) != 0;
    case kString: return c.str(what);
    case kU64: return c.pod<uint64_t>(what);
    case kI64: return c.pod<int64_t>(what);
    case kF64: return c.pod<double>(what);
    default:
      DS_CHECK(false, ModelFileError, "GGUF file ", path, ": ", what, " has value type ", type,
               "; expected 0-12 (gguf_type)");
  }
  return {};
}

nlohmann::json read_value(Cursor& c, uint32_t type, const std::string& what, const std::string& path) {
  if (type != kArray) return read_scalar(c, type, what, path);
  const auto elem = c.pod<uint32_t>(what + " (array element type)");
  const auto n = c.pod<uint64_t>(what + " (array length)");
  DS_CHECK(elem != kArray, ModelFileError, "GGUF file ", path, ": ", what,
           " is an array of arrays, which this reader does not support");
  // Every element takes at least one byte: a larger count means a corrupt or truncated file.
  DS_CHECK(n <= c.remaining(), ModelFileError, "GGUF file ", path, " is truncated: ", what,
           " claims ", n, " elements but only ", c.remaining(), " bytes are left");
  nlohmann::json arr = nlohmann::json::array();
  arr.get_ref<nlohmann::json::array_t&>().reserve(n);
  for (uint64_t i = 0; i < n; ++i) arr.push_back(read_scalar(c, elem, what, path));
  return arr;
}

uint64_t file_size(const std::string& path) {
  struct stat st {};
  DS_CHECK(::stat(path.c_str(), &st) == 0, ModelFileError, "GGUF file ", path,
           ": not found (give --model a .gguf file or a Hugging Face folder)");
  return static_cast<uint64_t>(st.st_size);
}

}  // namespace

int64_t GgufTensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

GgufFile GgufFile::open(const std::string& path) {
  GgufFile f;
  f.path_ = path;
  const uint64_t size = file_size(path);
  Cursor c(path, size);
  char magic[4];
  c.read(magic, 4, "the magic");
  DS_CHECK(std::string(magic, 4) == "GGUF", ModelFileError, "GGUF file ", path,
           ": magic is not \"GGUF\"; not a GGUF file");
  f.version_ = c.pod<uint32_t>("the version");
  DS_CHECK(f.version_ == 2 || f.version_ == 3, ModelFileError, "GGUF file ", path, ": version ",
           f.version_, "; this reader supports versions 2 and 3");
  const auto n_tensors = c.pod<uint64_t>("the tensor count");
  const auto n_kv = c.pod<uint64_t>("the metadata count");

  f.metadata_ = nlohmann::json::object();
  for (uint64_t i = 0; i < n_kv; ++i) {
    const std::string what = "metadata entry " + std::to_string(i);
    std::string key = c.str(what + " key");
    const auto type = c.pod<uint32_t>("the type of metadata '" + key + "'");
    f.metadata_[key] = read_value(c, type, "metadata '" + key + "'", path);
  }
  if (f.has("general.alignment")) {
    f.alignment_ = static_cast<uint64_t>(f.get_int("general.alignment"));
    DS_CHECK(f.alignment_ > 0 && (f.alignment_ & (f.alignment_ - 1)) == 0, ModelFileError,
             "GGUF file ", path, ": general.alignment is ", f.alignment_, "; expected a power of 2");
  }

  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensorInfo t;
    t.name = c.str("the name of tensor " + std::to_string(i));
    const std::string what = "tensor info '" + t.name + "'";
    const auto n_dims = c.pod<uint32_t>(what + " (dimension count)");
    DS_CHECK(n_dims >= 1 && n_dims <= 4, ModelFileError, "GGUF file ", path, ": tensor '", t.name,
             "' has ", n_dims, " dimensions; expected 1 to 4");
    t.shape.resize(n_dims);
    for (uint32_t d = 0; d < n_dims; ++d) {
      const auto ne = c.pod<uint64_t>(what + " (dimensions)");
      DS_CHECK(ne <= static_cast<uint64_t>(std::numeric_limits<int32_t>::max()), ModelFileError,
               "GGUF file ", path, ": tensor '", t.name, "' has a dimension of ", ne);
      t.shape[n_dims - 1 - d] = static_cast<int64_t>(ne);
    }
    t.type = c.pod<uint32_t>(what + " (type)");
    t.offset = c.pod<uint64_t>(what + " (offset)");
    const auto nbytes = ggml_type_nbytes(t.type, t.numel());
    DS_CHECK(ggml_block_values(t.type) != 0, ModelFileError, "GGUF file ", path, ": tensor '",
             t.name, "' has ggml type ", t.type, " (", ggml_type_name(t.type),
             "); this reader decodes ", ggml_decoded_type_names(),
             "; re-quantize the model to one of them");
    DS_CHECK(nbytes.has_value(), ModelFileError, "GGUF file ", path, ": tensor '", t.name,
             "' has ", t.numel(), " values of ggml type ", ggml_type_name(t.type),
             ", not a whole number of its ", ggml_block_values(t.type), "-value blocks");
    t.nbytes = *nbytes;
    f.tensors_.push_back(std::move(t));
  }

  const uint64_t data_start = (c.pos() + f.alignment_ - 1) / f.alignment_ * f.alignment_;
  for (auto& t : f.tensors_) {
    DS_CHECK(t.offset % f.alignment_ == 0, ModelFileError, "GGUF file ", path, ": tensor '",
             t.name, "' has offset ", t.offset, ", not a multiple of the alignment ", f.alignment_);
    t.offset += data_start;
    DS_CHECK(t.offset <= size && t.nbytes <= size - t.offset, ModelFileError, "GGUF file ", path,
             " is truncated: tensor '", t.name, "' needs bytes [", t.offset, ", ",
             t.offset + t.nbytes, ") but the file has ", size, " bytes");
  }
  return f;
}

int64_t GgufFile::get_int(const std::string& key) const {
  DS_CHECK(has(key), ModelFileError, "GGUF file ", path_, ": metadata '", key, "' is missing");
  const auto& v = metadata_.at(key);
  DS_CHECK(v.is_number_integer(), ModelFileError, "GGUF file ", path_, ": metadata '", key,
           "' is ", v.type_name(), "; expected an integer");
  return v.get<int64_t>();
}

double GgufFile::get_float(const std::string& key) const {
  DS_CHECK(has(key), ModelFileError, "GGUF file ", path_, ": metadata '", key, "' is missing");
  const auto& v = metadata_.at(key);
  DS_CHECK(v.is_number(), ModelFileError, "GGUF file ", path_, ": metadata '", key, "' is ",
           v.type_name(), "; expected a number");
  return v.get<double>();
}

std::string GgufFile::get_string(const std::string& key) const {
  DS_CHECK(has(key), ModelFileError, "GGUF file ", path_, ": metadata '", key, "' is missing");
  const auto& v = metadata_.at(key);
  DS_CHECK(v.is_string(), ModelFileError, "GGUF file ", path_, ": metadata '", key, "' is ",
           v.type_name(), "; expected a string");
  return v.get<std::string>();
}

const nlohmann::json& GgufFile::get_array(const std::string& key) const {
  DS_CHECK(has(key), ModelFileError, "GGUF file ", path_, ": metadata '", key, "' is missing");
  const auto& v = metadata_.at(key);
  DS_CHECK(v.is_array(), ModelFileError, "GGUF file ", path_, ": metadata '", key, "' is ",
           v.type_name(), "; expected an array");
  return v;
}

const GgufTensorInfo* GgufFile::find_tensor(const std::string& name) const {
  for (const auto& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

at::Tensor GgufFile::load_tensor(const std::string& name, at::ScalarType dtype) const {
  const GgufTensorInfo* t = find_tensor(name);
  DS_CHECK(t != nullptr, ModelFileError, "GGUF file ", path_, ": tensor '", name,
           "' is missing from the tensor table");
  std::vector<uint8_t> raw(t->nbytes);
  std::ifstream in(path_, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(t->offset));
  in.read(reinterpret_cast<char*>(raw.data()), static_cast<std::streamsize>(raw.size()));
  DS_CHECK(in.good(), ModelFileError, "GGUF file ", path_, ": cannot read tensor '", name,
           "' (", t->nbytes, " bytes at offset ", t->offset, "); was the file changed?");
  at::Tensor out = at::empty(t->shape, at::kFloat);
  dequantize_to_float(t->type, raw.data(), t->numel(), out.data_ptr<float>());
  return dtype == at::kFloat ? out : out.to(dtype);
}

}  // namespace deepspeed::examples
