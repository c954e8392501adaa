// ShardSwapper: shard states, buffers and transfers (see shard_swapper.h).
#include "runtime/swap/shard_swapper.h"

#include <filesystem>
#include <optional>

#include <ATen/ATen.h>

#include "runtime/swap/aio_wait.h"
#include "runtime/swap/swap_buffer_pool.h"
#include "runtime/swap/swap_folder_lock.h"
#include "util/check.h"
#include "util/logging.h"

namespace deepspeed::runtime::swap {
namespace {

enum class Where { kResident, kOnDisk, kReading, kInMemory };

struct Shard {
  at::Tensor handle;  // the caller's tensor
  int64_t numel = 0;
  Where where = Where::kResident;
  int buffer = -1;
  int64_t offset = 0;  // bytes into the buffer
};

// Shards packed end to end into a buffer; it goes back to the pool when its last one leaves.
struct BufferUse {
  int64_t used = 0;
  int users = 0;
};

std::string dtype_folder(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat: return "float32params";
    case at::kBFloat16: return "bfloat16params";
    case at::kHalf: return "float16params";
    default: return std::string(c10::toString(dtype)) + "params";
  }
}

}  // namespace

class ShardSwapper::Impl {
 public:
  explicit Impl(ShardSwapperOptions options)
      : options_(std::move(options)), read_(options_.aio), write_(options_.aio) {
    DS_CHECK(options_.buffer_count >= 1, ConfigError,
             "zero_optimization.offload_param.buffer_count is ", options_.buffer_count,
             "; NVMe parameter swapping needs at least one buffer");
    DS_CHECK(options_.buffer_size >= 1, ConfigError,
             "zero_optimization.offload_param.buffer_size is ", options_.buffer_size,
             "; it must be at least 1 element");
    folder_ = (std::filesystem::path(options_.nvme_path) / "zero_stage_3" /
               dtype_folder(options_.dtype) / ("rank" + std::to_string(options_.rank)))
                  .string();
    std::error_code ec;
    std::filesystem::create_directories(folder_, ec);
    if (ec) {
      throw aio::AioError("cannot create the parameter swap folder " + folder_ + ": " +
                          ec.message() + " (zero_optimization.offload_param.nvme_path is " +
                          options_.nvme_path + ")");
    }
    lock_ = std::make_unique<SwapFolderLock>(folder_, "zero_optimization.offload_param",
                                             options_.nvme_path);
  }

  ~Impl() {
    try {
      read_.wait();
      write_.wait();
    } catch (const std::exception& e) {
      log::warn(std::string("parameter swapper: ") + e.what());
    }
    std::error_code ec;
    for (size_t id = 0; id < shards_.size(); ++id) {
      if (shards_[id].where != Where::kResident) std::filesystem::remove(path(static_cast<int>(id)), ec);
    }
  }

  int add(const at::Tensor& shard) {
    DS_CHECK(!pool_, UsageError, "parameter swapper: add every shard before the first swap_in");
    DS_CHECK(shard.defined() && shard.device().is_cpu() && shard.is_contiguous() &&
                 shard.dim() == 1 && shard.scalar_type() == options_.dtype,
             UsageError, "parameter swapper: a shard must be a contiguous 1-D CPU tensor of ",
             options_.dtype);
    const int id = static_cast<int>(shards_.size());
    Shard s;
    s.handle = shard;
    s.numel = shard.numel();
    if (kept_numel_ + s.numel <= options_.max_in_cpu) {
      kept_numel_ += s.numel;
      shards_.push_back(std::move(s));
      return id;
    }
    DS_CHECK(s.numel <= options_.buffer_size, ConfigError,
             "zero_optimization.offload_param.buffer_size (", options_.buffer_size,
             " elements) is smaller than a parameter shard of ", s.numel,
             " elements; raise buffer_size to at least that");
    largest_numel_ = std::max(largest_numel_, s.numel);
    swapped_numel_ += s.numel;
    shards_.push_back(std::move(s));
    Shard& added = shards_.back();
    try {
      write_.sync_pwrite(added.handle, path(id));
    } catch (const aio::AioError& err) {
      throw aio::AioError(std::string(err.what()) + " (while writing parameter shard " +
                          std::to_string(id) + " to " + folder_ + " for the first time)");
    }
    writes_ += 1;
    drop(added);
    added.where = Where::kOnDisk;
    return id;
  }

  void prefetch(const std::vector<int>& ids) {
    for (int id : ids) {
      Shard& s = shard(id);
      if (s.where != Where::kOnDisk) continue;
      if (!start_read(id, /*required=*/false)) break;
    }
  }

  void swap_in(const std::vector<int>& ids) {
    ensure_pool();
    std::vector<int64_t> sizes;
    for (int id : ids) {
      if (shard(id).where == Where::kOnDisk) sizes.push_back(shard_bytes(shard(id)));
    }
    DS_CHECK(fits(sizes), ConfigError, "zero_optimization.offload_param.buffer_count (",
             options_.buffer_count, ") buffers of ", buffer_bytes_ / element_bytes(),
             " elements (offload_param.buffer_size ", options_.buffer_size,
             ") cannot hold the ", sizes.size(),
             " parameter shards one all-gather needs next to the ones held now; raise "
             "buffer_count or buffer_size");
    for (int id : ids) {
      if (shard(id).where == Where::kOnDisk) start_read(id, /*required=*/true);
    }
    settle_reads();
  }

  void release(const std::vector<int>& ids) {
    for (int id : ids) {
      Shard& s = shard(id);
      if (s.where != Where::kInMemory) continue;
      drop(s);
      give_back(s);
      s.where = Where::kOnDisk;
    }
  }

  void write(int id, const at::Tensor& values) {
    Shard& s = shard(id);
    DS_CHECK(values.numel() == s.numel, UsageError, "parameter swapper: shard ", id, " has ",
             s.numel, " elements, the new values ", values.numel());
    at::Tensor flat = values.reshape({-1}).to(options_.dtype);
    if (s.where == Where::kResident) {
      s.handle.copy_(flat);
      return;
    }
    if (s.where == Where::kReading) settle_reads();  // the read must not land after the write
    if (s.where == Where::kInMemory) s.handle.copy_(flat);
    if (!staging_.defined() || staging_.numel() < s.numel) {
      staging_ = aio::new_aligned_tensor(largest_numel_, options_.dtype);
    }
    at::Tensor src = staging_.narrow(0, 0, s.numel);
    src.copy_(flat);
    try {
      write_.sync_pwrite(src, path(id));
    } catch (const aio::AioError& err) {
      throw aio::AioError(std::string(err.what()) + " (while writing updated parameter shard " +
                          std::to_string(id) + ")");
    }
    writes_ += 1;
  }

  Shard& shard(int id) {
    DS_CHECK(id >= 0 && id < static_cast<int>(shards_.size()), UsageError,
             "parameter swapper: no shard ", id, " (", shards_.size(), " registered)");
    return shards_[static_cast<size_t>(id)];
  }
  const Shard& shard(int id) const { return const_cast<Impl*>(this)->shard(id); }

  std::string path(int id) const {
    return folder_ + "/" + std::to_string(id) + "_param.tensor.swp";
  }

  int64_t bytes(bool swapped) const {
    int64_t total = 0;
    const int64_t element = static_cast<int64_t>(c10::elementSize(options_.dtype));
    for (const auto& s : shards_) {
      if ((s.where != Where::kResident) == swapped) total += aligned_bytes(s.numel * element);
    }
    return total;
  }

  ShardSwapperOptions options_;
  std::string folder_;
  std::unique_ptr<SwapFolderLock> lock_;  // released after ~Impl removed the files
  aio::AioHandle read_;
  aio::AioHandle write_;
  std::vector<Shard> shards_;
  int64_t kept_numel_ = 0;
  int64_t largest_numel_ = 0;
  int64_t swapped_numel_ = 0;
  std::unique_ptr<SwapBufferPool> pool_;
  int64_t buffer_bytes_ = 0;
  std::vector<BufferUse> uses_;
  int current_ = -1;    // the buffer new reads are packed into
  at::Tensor staging_;  // aligned source of write()
  int64_t reads_ = 0;
  int64_t writes_ = 0;

 private:
  static void drop(Shard& s) { s.handle.set_data(at::empty({0}, s.handle.options())); }

  int64_t element_bytes() const {
    return static_cast<int64_t>(c10::elementSize(options_.dtype));
  }
  int64_t shard_bytes(const Shard& s) const { return aligned_bytes(s.numel * element_bytes()); }

  // Buffers of buffer_size elements, or less when the swapped shards all fit in less.
  void ensure_pool() {
    if (pool_) return;
    const int64_t numel = std::min(options_.buffer_size, std::max<int64_t>(swapped_numel_, 1));
    buffer_bytes_ = aligned_bytes(std::max(numel, largest_numel_) * element_bytes());
    pool_ = std::make_unique<SwapBufferPool>(options_.buffer_count, buffer_bytes_);
    uses_.assign(static_cast<size_t>(options_.buffer_count), BufferUse{});
  }

  // Whether shards of these byte sizes can be packed into the room left now.
  bool fits(const std::vector<int64_t>& sizes) const {
    int64_t room = current_ >= 0 ? buffer_bytes_ - uses_[static_cast<size_t>(current_)].used : 0;
    int64_t free_buffers = pool_->free_count();
    for (int64_t b : sizes) {
      if (b <= room) {
        room -= b;
      } else if (free_buffers > 0) {
        free_buffers -= 1;
        room = buffer_bytes_ - b;
      } else {
        return false;
      }
    }
    return true;
  }

  // Room for `bytes` in the current buffer or a fresh one: {buffer, offset}, or {-1, 0}.
  std::pair<int, int64_t> place(int64_t bytes) {
    if (current_ < 0 || uses_[static_cast<size_t>(current_)].used + bytes > buffer_bytes_) {
      current_ = pool_->acquire();
      if (current_ < 0) return {-1, 0};
    }
    BufferUse& u = uses_[static_cast<size_t>(current_)];
    const int64_t offset = u.used;
    u.used += bytes;
    u.users += 1;
    return {current_, offset};
  }

  void give_back(Shard& s) {
    BufferUse& u = uses_[static_cast<size_t>(s.buffer)];
    u.users -= 1;
    if (u.users == 0) {
      u.used = 0;
      pool_->release(s.buffer);
      if (current_ == s.buffer) current_ = -1;
    }
    s.buffer = -1;
  }

  at::Tensor view_of(const Shard& s) {
    return pool_->view(s.buffer, s.offset, s.numel, options_.dtype);
  }

  bool start_read(int id, bool required) {
    ensure_pool();
    Shard& s = shard(id);
    auto [b, offset] = place(shard_bytes(s));
    DS_INTERNAL_ASSERT(b >= 0 || !required, "swap_in checked that its shards fit");
    if (b < 0) return false;
    s.buffer = b;
    s.offset = offset;
    s.where = Where::kReading;
    try {
      read_.async_pread(view_of(s), path(id));
    } catch (const aio::AioError& err) {
      give_back(s);
      s.where = Where::kOnDisk;
      throw aio::AioError(std::string(err.what()) + " (while swapping in parameter shard " +
                          std::to_string(id) + ")");
    }
    reads_ += 1;
    return true;
  }

  void settle_reads() {
    const std::optional<aio::AioError> failure = wait_all(read_);
    for (auto& s : shards_) {
      if (s.where != Where::kReading) continue;
      if (failure) {
        give_back(s);
        s.where = Where::kOnDisk;
        continue;
      }
      s.handle.set_data(view_of(s));
      s.where = Where::kInMemory;
    }
    if (failure) {
      throw aio::AioError(std::string(failure->what()) + " (while swapping in parameter shards)");
    }
  }
};

ShardSwapper::ShardSwapper(ShardSwapperOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {}
ShardSwapper::~ShardSwapper() = default;

int ShardSwapper::add(const at::Tensor& shard) { return impl_->add(shard); }
void ShardSwapper::prefetch(const std::vector<int>& ids) { impl_->prefetch(ids); }
void ShardSwapper::swap_in(const std::vector<int>& ids) { impl_->swap_in(ids); }
void ShardSwapper::release(const std::vector<int>& ids) { impl_->release(ids); }
void ShardSwapper::write(int id, const at::Tensor& values) { impl_->write(id, values); }
bool ShardSwapper::swapped(int id) const { return impl_->shard(id).where != Where::kResident; }
bool ShardSwapper::in_memory(int id) const {
  const Where w = impl_->shard(id).where;
  return w == Where::kResident || w == Where::kInMemory;
}
std::string ShardSwapper::swap_path(int id) const { return impl_->path(id); }
const std::string& ShardSwapper::swap_folder() const { return impl_->folder_; }
int64_t ShardSwapper::swapped_bytes() const { return impl_->bytes(/*swapped=*/true); }
int64_t ShardSwapper::resident_bytes() const { return impl_->bytes(/*swapped=*/false); }
int64_t ShardSwapper::buffer_bytes() const {
  return impl_->pool_ ? impl_->pool_->allocated_bytes() : 0;
}
int64_t ShardSwapper::reads() const { return impl_->reads_; }
int64_t ShardSwapper::writes() const { return impl_->writes_; }

}  // namespace deepspeed::runtime::swap
