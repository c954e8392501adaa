// The safetensors format, written and read without the library: an 8-byte little-endian
// header length N, N bytes of JSON {name: {"dtype", "shape", "data_offsets": [begin, end]},
// "__metadata__": {str: str}} padded with spaces to a multiple of 8 (so that the data is
// 8-byte aligned), then the tensors' raw little-endian bytes, back to back, offsets relative
// to the end of the header.
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include <ATen/ATen.h>

#include "deepspeed/checkpoint.h"
#include "util/check.h"

namespace deepspeed::checkpoint {
namespace {

const std::pair<at::ScalarType, const char*> kDtypes[] = {
    {at::kDouble, "F64"}, {at::kFloat, "F32"}, {at::kHalf, "F16"}, {at::kBFloat16, "BF16"},
    {at::kLong, "I64"},   {at::kInt, "I32"},   {at::kShort, "I16"}, {at::kChar, "I8"},
    {at::kByte, "U8"},    {at::kBool, "BOOL"},
};

const char* dtype_name(at::ScalarType dtype, const std::string& tensor) {
  for (const auto& [type, name] : kDtypes) {
    if (type == dtype) return name;
  }
  DS_CHECK(false, NotSupportedError, "safetensors has no dtype for tensor '", tensor, "' (",
           dtype, ")");
  return nullptr;
}

std::optional<at::ScalarType> dtype_of(const std::string& name) {
  for (const auto& [type, n] : kDtypes) {
    if (name == n) return type;
  }
  return std::nullopt;
}

}  // namespace

void save_safetensors(const TensorDict& tensors, const std::string& path,
                      const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& item : tensors) {
    const at::Tensor& t = item.value();
    DS_CHECK(t.defined() && t.layout() == at::kStrided, NotSupportedError, "safetensors: tensor '",
             item.key(), "' is undefined or not dense");
    DS_CHECK(item.key() != "__metadata__", UsageError,
             "safetensors: '__metadata__' is reserved and cannot name a tensor");
    const uint64_t nbytes = static_cast<uint64_t>(t.numel()) * t.element_size();
    header[item.key()] = {{"dtype", dtype_name(t.scalar_type(), item.key())},
                          {"shape", t.sizes().vec()},
                          {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t header_size = text.size();

  AtomicFile file(path);
  file.write(&header_size, sizeof header_size);  // little-endian host (see pickle_writer.cpp)
  file.write(text.data(), text.size());
  for (const auto& item : tensors) {
    at::Tensor host = item.value().to(at::kCPU).contiguous();
    if (host.numel() > 0) file.write(host.data_ptr(), host.numel() * host.element_size());
  }
  file.commit();
}

TensorDict load_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  DS_CHECK(in.good(), CheckpointError, path, ": cannot open: ", std::strerror(errno));
  in.seekg(0, std::ios::end);
  const uint64_t file_size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  uint64_t header_size = 0;
  DS_CHECK(file_size >= 8 && in.read(reinterpret_cast<char*>(&header_size), 8), CheckpointError,
           path, ": truncated safetensors file (", file_size, " bytes, no header length)");
  DS_CHECK(header_size <= file_size - 8, CheckpointError, path, ": header length ", header_size,
           " exceeds the file (", file_size, " bytes): truncated or not a safetensors file");
  std::string text(header_size, '\0');
  in.read(text.data(), static_cast<std::streamsize>(header_size));
  json header;
  try {
    header = json::parse(text);
  } catch (const json::exception& e) {
    DS_CHECK(false, CheckpointError, path, ": malformed safetensors header: ", e.what());
  }
  DS_CHECK(header.is_object(), CheckpointError, path, ": safetensors header is not a JSON object");
  const uint64_t data_start = 8 + header_size;
  const uint64_t data_size = file_size - data_start;

  struct Entry {
    std::string name;
    at::ScalarType dtype;
    std::vector<int64_t> shape;
    uint64_t begin, end;
  };
  std::vector<Entry> entries;
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") continue;
    try {
      Entry e{name, at::kFloat, info.at("shape").get<std::vector<int64_t>>(),
              info.at("data_offsets").at(0).get<uint64_t>(),
              info.at("data_offsets").at(1).get<uint64_t>()};
      auto dtype = dtype_of(info.at("dtype").get<std::string>());
      DS_CHECK(dtype.has_value(), CheckpointError, path, ": tensor '", name, "' has dtype ",
               info.at("dtype").dump(), ", which this reader does not know");
      e.dtype = *dtype;
      entries.push_back(std::move(e));
    } catch (const json::exception& ex) {
      DS_CHECK(false, CheckpointError, path, ": malformed header entry for '", name, "': ",
               ex.what());
    }
  }
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return a.begin < b.begin; });
  TensorDict out;
  for (const auto& e : entries) {
    int64_t numel = 1;
    for (int64_t d : e.shape) {
      DS_CHECK(d >= 0, CheckpointError, path, ": tensor '", e.name, "' has a negative dimension");
      numel *= d;
    }
    const uint64_t nbytes = static_cast<uint64_t>(numel) * c10::elementSize(e.dtype);
    DS_CHECK(e.begin <= e.end && e.end - e.begin == nbytes, CheckpointError, path, ": tensor '",
             e.name, "' spans bytes [", e.begin, ", ", e.end, ") but its shape and dtype need ",
             nbytes);
    DS_CHECK(e.end <= data_size, CheckpointError, path, ": tensor '", e.name, "' ends at byte ",
             e.end, " of the data, which holds only ", data_size, " (truncated file)");
    at::Tensor t = at::empty(e.shape, at::TensorOptions().dtype(e.dtype));
    if (nbytes > 0) {
      in.seekg(static_cast<std::streamoff>(data_start + e.begin));
      DS_CHECK(in.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(nbytes)),
               CheckpointError, path, ": read failed for tensor '", e.name, "'");
    }
    out.insert(e.name, t);
  }
  return out;
}

}  // namespace deepspeed::checkpoint
