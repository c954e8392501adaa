// save()/load(): torch.save's zip container around the pickle. Written by LibTorch's
// caffe2::serialize::PyTorchStreamWriter (the code torch.save itself runs), read by our
// ZipReader, which checks what LibTorch's reader does not (Note [Zip checks]): records
// "<archive>/data.pkl", "<archive>/data/<key>" (64-byte aligned, stored uncompressed),
// "<archive>/byteorder" and "<archive>/version". Storage records are written while pickling
// and data.pkl last; readers locate records through the central directory, so order is free.
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <caffe2/serialize/inline_container.h>
#include <caffe2/serialize/versions.h>

#include "deepspeed/checkpoint.h"
#include "runtime/checkpoint/direct_write_stream.h"
#include "runtime/checkpoint/pickle_reader.h"
#include "runtime/checkpoint/pickle_writer.h"
#include "runtime/checkpoint/zip_reader.h"
#include "util/check.h"

namespace deepspeed::checkpoint {
namespace {

using c10::IValue;
using detail::ZipReader;
using detail::ZipRecord;
using caffe2::serialize::PyTorchStreamWriter;

// Writes value's records through `writer` and finishes the archive. Once `failed()` the
// remaining storages are skipped: the archive is being discarded.
void write_archive(const IValue& value, PyTorchStreamWriter& writer,
                   const std::function<bool()>& failed = [] { return false; }) {
  std::string pickle = detail::pickle_value(
      value, [&](const std::string& key, const void* data, size_t nbytes) {
        if (!failed()) writer.writeRecord("data/" + key, data, nbytes);
      });
  writer.writeRecord("data.pkl", pickle.data(), pickle.size());
  // torch >= 2.1 reads this to byte-swap on big-endian hosts; older readers ignore it.
  static const std::string kByteOrder = "little";
  writer.writeRecord("byteorder", kByteOrder.data(), kByteOrder.size());
  writer.writeEndOfFile();
}

// LibTorch's rule: "<archive>/version" (or ".data/version", torch >= 2.1) within the format
// versions this LibTorch reads.
void check_version(const ZipReader& reader, const std::string& source) {
  const ZipRecord* record = reader.find(".data/version");
  if (record == nullptr) record = reader.find("version");
  DS_CHECK(record != nullptr, CheckpointError, source,
           ": the archive has no version record, so it is not a torch.save file");
  c10::DataPtr data = reader.read(*record);
  const std::string text(static_cast<const char*>(data.get()), record->size);
  uint64_t version = 0;
  size_t digits = 0;
  for (; digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits])); ++digits) {
    version = version * 10 + static_cast<uint64_t>(text[digits] - '0');
  }
  DS_CHECK(digits > 0 && digits <= 9 &&
               version >= caffe2::serialize::kMinSupportedFileFormatVersion &&
               version <= caffe2::serialize::kMaxSupportedFileFormatVersion,
           CheckpointError, source, ": archive format version '", text,
           "' is not one this LibTorch reads (", caffe2::serialize::kMinSupportedFileFormatVersion,
           " to ", caffe2::serialize::kMaxSupportedFileFormatVersion, ")");
}

IValue read_archive(const ZipReader& reader, const std::string& source) {
  check_version(reader, source);
  const ZipRecord* pickle = reader.find("data.pkl");
  DS_CHECK(pickle != nullptr, CheckpointError, source,
           ": the archive has no data.pkl, so it is not a torch.save file",
           reader.has_record("constants.pkl") ? " (it is a TorchScript module: use torch::jit::load)"
                                              : "");
  c10::DataPtr pickle_data = reader.read(*pickle);
  auto storages = [&](const std::string& key, size_t nbytes) -> c10::Storage {
    const std::string name = "data/" + key;
    const ZipRecord* record = reader.find(name);
    DS_CHECK(record != nullptr, CheckpointError, source, ": tensor data record '", name,
             "' is missing (truncated or corrupt file)");
    // Checked before reading: the record's size comes from the zip directory, bounded there.
    DS_CHECK(record->size >= nbytes, CheckpointError, source, ": tensor data record '", name,
             "' holds ", record->size, " bytes, the pickle needs ", nbytes,
             " (truncated or corrupt file)");
    return c10::Storage(c10::Storage::use_byte_size_t(), record->size, reader.read(*record),
                        /*allocator=*/nullptr, /*resizable=*/false);
  };
  IValue value = detail::unpickle_value(static_cast<const char*>(pickle_data.get()),
                                        pickle->size, storages, source);
  // Note [Zip checks]: the small records the pickle does not name are CRC-checked too.
  const std::string prefix = reader.archive_name() + "/";
  for (const auto& record : reader.records()) {
    const bool in_archive = record.name.compare(0, prefix.size(), prefix) == 0;
    const std::string name = in_archive ? record.name.substr(prefix.size()) : record.name;
    if (in_archive && (name == "data.pkl" || name.compare(0, 5, "data/") == 0)) continue;
    reader.read(record);
  }
  return value;
}

// c10 errors of the zip layer, with the file named and a hint.
template <typename Fn>
auto with_zip_errors(const std::string& source, const char* doing, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const c10::Error& e) {
    throw CheckpointError(::deepspeed::detail::str_cat(
        source, ": ", doing, " failed: ", e.what_without_backtrace(),
        " (a truncated file usually means the save that wrote it was interrupted; use the "
        "previous checkpoint tag)"));
  }
}

// The first bytes tell a zip archive from the legacy torch.save format and from garbage.
void check_zip_magic(const std::string& head, const std::string& source) {
  if (head.size() >= 4 && head.compare(0, 4, "PK\x03\x04") == 0) return;
  DS_CHECK(!head.empty(), CheckpointError, source, ": the file is empty (an interrupted save?)");
  DS_CHECK(static_cast<unsigned char>(head[0]) != 0x80, CheckpointError, source,
           ": this is torch.save's legacy (non-zip) format (_use_new_zipfile_serialization=False, "
           "DeepSpeed's checkpoint.checkpoint_serialization: false), which is not supported; "
           "re-save it with the zip format");
  DS_CHECK(false, CheckpointError, source, ": not a PyTorch checkpoint (no zip header)");
}

}  // namespace

void save(const IValue& value, const std::string& path) { save(value, path, WriteOptions{}); }

void save(const IValue& value, const std::string& path, const WriteOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  AtomicFile file(path);
  std::optional<DirectWriteStream> direct;
  if (options.mode == WriteMode::kDirect) {
    direct.emplace(file, options.io_buffer_size, options.io_buffer_double);
  }
  int64_t archive_bytes = 0;
  // The writer callback never reports a short write: LibTorch 1.13's PyTorchStreamWriter, once
  // it has seen one, throws again from its destructor, which terminates the process. The first
  // error (e.g. "No space left on device") is kept, the rest of the archive goes nowhere, and
  // the error is thrown once the writer is done.
  std::string write_error;
  PyTorchStreamWriter writer([&](const void* data, size_t size) -> size_t {
    archive_bytes += static_cast<int64_t>(size);
    if (write_error.empty() && options.mode != WriteMode::kMock) {
      try {
        if (direct) {
          direct->write(data, size);
        } else {
          file.write(data, size);
        }
      } catch (const std::exception& e) {
        write_error = e.what();
      }
    }
    return size;
  });
  try {
    write_archive(value, writer, [&] { return !write_error.empty(); });
  } catch (const c10::Error& e) {
    throw CheckpointError(::deepspeed::detail::str_cat(path, ": writing the archive failed: ",
                                                       e.what_without_backtrace()));
  }
  if (direct && write_error.empty()) {
    try {
      direct->finish();
    } catch (const std::exception& e) {
      write_error = e.what();
    }
  }
  DS_CHECK(write_error.empty(), CheckpointError, write_error);
  file.commit();
  if (options.stats != nullptr) {
    *options.stats = WriteStats{};
    options.stats->bytes = archive_bytes;
    options.stats->seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    options.stats->direct_io = direct && direct->direct_io();
    options.stats->buffers = direct ? direct->buffers_drained() : 0;
  }
}

IValue load(const std::string& path) {
  struct stat st {};
  DS_CHECK(::stat(path.c_str(), &st) == 0, CheckpointError, path, ": cannot open: ",
           std::strerror(errno));
  DS_CHECK(S_ISREG(st.st_mode), CheckpointError, path, ": not a regular file");
  {
    std::ifstream in(path, std::ios::binary);
    std::string head(4, '\0');
    in.read(head.data(), 4);
    head.resize(static_cast<size_t>(in.gcount()));
    check_zip_magic(head, path);
  }
  return read_archive(ZipReader::open_file(path), path);
}

std::string save_to_string(const IValue& value) {
  std::string out;
  PyTorchStreamWriter writer([&](const void* data, size_t size) -> size_t {
    out.append(static_cast<const char*>(data), size);
    return size;
  });
  with_zip_errors("<memory>", "writing the archive", [&] { write_archive(value, writer); });
  return out;
}

IValue load_from_string(const std::string& bytes, const std::string& source) {
  check_zip_magic(bytes.substr(0, 4), source);
  return read_archive(ZipReader::open_memory(bytes, source), source);
}

}  // namespace deepspeed::checkpoint
