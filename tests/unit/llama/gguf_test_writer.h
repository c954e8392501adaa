// Writes small GGUF files for the reader's tests: metadata of any type, tensors given as raw
// bytes of a ggml type, padding to the alignment. Test-only; mirrors the layout gguf_file.cpp
// documents, so that the reader is checked against an independent writer.
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace deepspeed::testing {

class GgufTestWriter {
 public:
  void kv_u32(const std::string& k, uint32_t v) { key(k, 4); pod(v); ++n_kv_; }
  void kv_f32(const std::string& k, float v) { key(k, 6); pod(v); ++n_kv_; }
  void kv_bool(const std::string& k, bool v) { key(k, 7); pod(static_cast<uint8_t>(v)); ++n_kv_; }
  void kv_str(const std::string& k, const std::string& v) { key(k, 8); str(v); ++n_kv_; }
  void kv_strs(const std::string& k, const std::vector<std::string>& v) {
    key(k, 9); pod<uint32_t>(8); pod<uint64_t>(v.size());
    for (const auto& s : v) str(s);
    ++n_kv_;
  }
  void kv_i32s(const std::string& k, const std::vector<int32_t>& v) {
    key(k, 9); pod<uint32_t>(5); pod<uint64_t>(v.size());
    for (int32_t x : v) pod(x);
    ++n_kv_;
  }
  void kv_f32s(const std::string& k, const std::vector<float>& v) {
    key(k, 9); pod<uint32_t>(6); pod<uint64_t>(v.size());
    for (float x : v) pod(x);
    ++n_kv_;
  }
  /// `ne` in GGUF order (contiguous dimension first).
  void tensor(const std::string& name, std::vector<uint64_t> ne, uint32_t type,
              const std::vector<uint8_t>& bytes) {
    tensors_.push_back({name, std::move(ne), type, bytes});
  }
  /// The whole file; `alignment` must match general.alignment if that key was written.
  std::vector<uint8_t> bytes(uint64_t alignment = 32) const {
    std::vector<uint8_t> out;
    auto put = [&](const void* p, size_t n) {
      const auto* b = static_cast<const uint8_t*>(p);
      out.insert(out.end(), b, b + n);
    };
    put("GGUF", 4);
    const uint32_t version = 3;
    put(&version, 4);
    const uint64_t nt = tensors_.size();
    put(&nt, 8);
    put(&n_kv_, 8);
    out.insert(out.end(), kv_.begin(), kv_.end());
    uint64_t offset = 0;
    std::vector<uint64_t> offsets;
    for (const auto& t : tensors_) {
      const uint64_t len = t.name.size();
      put(&len, 8);
      put(t.name.data(), len);
      const uint32_t nd = static_cast<uint32_t>(t.ne.size());
      put(&nd, 4);
      for (uint64_t d : t.ne) put(&d, 8);
      put(&t.type, 4);
      put(&offset, 8);
      offsets.push_back(offset);
      offset += (t.data.size() + alignment - 1) / alignment * alignment;
    }
    out.resize((out.size() + alignment - 1) / alignment * alignment, 0);
    const size_t data_start = out.size();
    for (size_t i = 0; i < tensors_.size(); ++i) {
      out.resize(data_start + offsets[i], 0);
      put(tensors_[i].data.data(), tensors_[i].data.size());
    }
    return out;
  }
  void write(const std::string& path, uint64_t alignment = 32) const {
    const auto b = bytes(alignment);
    std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(b.data()),
                                                static_cast<std::streamsize>(b.size()));
  }

 private:
  struct Tensor {
    std::string name;
    std::vector<uint64_t> ne;
    uint32_t type;
    std::vector<uint8_t> data;
  };
  template <typename T>
  void pod(T v) {
    const auto* b = reinterpret_cast<const uint8_t*>(&v);
    kv_.insert(kv_.end(), b, b + sizeof(T));
  }
  void str(const std::string& s) {
    pod<uint64_t>(s.size());
    kv_.insert(kv_.end(), s.begin(), s.end());
  }
  void key(const std::string& k, uint32_t type) { str(k); pod(type); }

  std::vector<uint8_t> kv_;
  uint64_t n_kv_ = 0;
  std::vector<Tensor> tensors_;
};

}  // namespace deepspeed::testing
