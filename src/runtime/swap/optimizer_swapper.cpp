// OptimizerSwapper: sub-group states, the read and write handles, and the swap pipeline (see
// optimizer_swapper.h).
#include "runtime/swap/optimizer_swapper.h"

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

// Matches DeepSpeed: tensors below max(1 MiB, block_size) are not worth an I/O request.
constexpr int64_t kMinAioBytes = 1 << 20;

// kHeld: in memory of its own (swap_in_all), not in a pool buffer.
enum class Where { kResident, kOnDisk, kReading, kInMemory, kWriting, kHeld };

struct Entry {
  std::string name;
  at::Tensor tensor;  // the caller's handle
  std::vector<int64_t> sizes;
  at::ScalarType dtype = at::kFloat;
  int64_t numel = 0;
  int64_t offset = 0;  // bytes into the sub-group's buffer
};

struct SubGroup {
  std::vector<Entry> entries;
  int64_t bytes = 0;  // buffer bytes (each tensor aligned)
  Where where = Where::kResident;
  int buffer = -1;
};

void check_name(const std::string& name) {
  DS_CHECK(!name.empty(), UsageError, "swap tensor names must not be empty");
  for (char c : name) {
    DS_CHECK(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.', UsageError,
             "swap tensor name '", name, "' has '", c, "'; use letters, digits, '_' and '.'");
  }
}

}  // namespace

class OptimizerSwapper::Impl {
 public:
  explicit Impl(SwapperOptions options)
      : options_(std::move(options)), read_(options_.aio), write_(options_.aio) {
    DS_CHECK(options_.buffer_count >= 1, ConfigError,
             "zero_optimization.offload_optimizer.buffer_count is ", options_.buffer_count,
             "; NVMe swapping needs at least one buffer");
    folder_ = (std::filesystem::path(options_.nvme_path) / "zero_stage_3" / "optimizer" /
               ("rank" + std::to_string(options_.rank)))
                  .string();
    std::error_code ec;
    std::filesystem::create_directories(folder_, ec);
    if (ec) {
      throw aio::AioError("cannot create the optimizer swap folder " + folder_ + ": " +
                          ec.message() + " (zero_optimization.offload_optimizer.nvme_path is " +
                          options_.nvme_path + ")");
    }
    lock_ = std::make_unique<SwapFolderLock>(folder_, "zero_optimization.offload_optimizer",
                                             options_.nvme_path);
    min_swap_bytes_ = options_.min_swap_bytes >= 0
                          ? options_.min_swap_bytes
                          : std::max(kMinAioBytes, options_.aio.block_size);
  }

  ~Impl() {
    try {
      synchronize();
    } catch (const std::exception& e) {
      log::warn(std::string("optimizer swapper: ") + e.what());
    }
    std::error_code ec;
    for (size_t id = 0; id < groups_.size(); ++id) {
      if (groups_[id].where == Where::kResident) continue;
      for (const auto& e : groups_[id].entries) {
        std::filesystem::remove(path(static_cast<int>(id), e.name), ec);
      }
    }
  }

  int add(std::vector<NamedTensor> tensors) {
    DS_CHECK(!pool_, UsageError,
             "optimizer swapper: add every sub-group before the first swap_in");
    SubGroup g;
    for (auto& t : tensors) {
      check_name(t.name);
      DS_CHECK(t.tensor.defined() && t.tensor.device().is_cpu() && t.tensor.is_contiguous(),
               UsageError, "optimizer swapper: tensor '", t.name,
               "' must be a contiguous CPU tensor");
      Entry e;
      e.name = t.name;
      e.tensor = t.tensor;
      e.sizes = t.tensor.sizes().vec();
      e.dtype = t.tensor.scalar_type();
      e.numel = t.tensor.numel();
      e.offset = g.bytes;
      g.bytes += aligned_bytes(static_cast<int64_t>(t.tensor.nbytes()));
      g.entries.push_back(std::move(e));
    }
    const int id = static_cast<int>(groups_.size());
    groups_.push_back(std::move(g));
    SubGroup& sg = groups_.back();
    if (sg.bytes < min_swap_bytes_) return id;  // kResident
    largest_bytes_ = std::max(largest_bytes_, sg.bytes);
    // The first write goes straight from the caller's memory (the engine does the bounce
    // copy where it is unaligned); later ones from the pool's buffers.
    try {
      for (const auto& e : sg.entries) write_.async_pwrite(e.tensor, path(id, e.name));
      write_.wait();
    } catch (const aio::AioError& err) {
      wait_all(write_);  // the writes already started end before the caller's tensors may go
      throw aio::AioError(std::string(err.what()) + " (while writing optimizer sub-group " +
                          std::to_string(id) + " to " + folder_ + " for the first time)");
    }
    writes_ += static_cast<int64_t>(sg.entries.size());
    release(sg);
    sg.where = Where::kOnDisk;
    return id;
  }

  void swap_in(int id) {
    SubGroup& g = group(id);
    if (g.where == Where::kResident || g.where == Where::kInMemory || g.where == Where::kHeld) {
      return;
    }
    if (g.where == Where::kWriting) settle_writes();  // its buffer's write must end first
    if (g.where == Where::kOnDisk) start_read(id, /*required=*/true);
    settle_reads();
    DS_INTERNAL_ASSERT(g.where == Where::kInMemory);
  }

  void prefetch(int id) {
    if (!options_.pipeline_read || id < 0 || id >= static_cast<int>(groups_.size())) return;
    if (group(id).where != Where::kOnDisk) return;
    start_read(id, /*required=*/false);
  }

  void swap_out(int id) {
    SubGroup& g = group(id);
    if (g.where == Where::kResident || g.where == Where::kHeld) return;
    DS_CHECK(g.where == Where::kInMemory, UsageError, "optimizer swapper: sub-group ", id,
             " is not in memory (swap_in before swap_out)");
    try {
      // Views of their own: the engine keeps them (and so the buffer) alive however the
      // caller's handles are re-pointed below.
      for (const auto& e : g.entries) {
        write_.async_pwrite(pool_->view(g.buffer, e.offset, e.numel, e.dtype), path(id, e.name));
      }
    } catch (const aio::AioError& err) {
      throw aio::AioError(std::string(err.what()) + " (while swapping out optimizer sub-group " +
                          std::to_string(id) + ")");
    }
    writes_ += static_cast<int64_t>(g.entries.size());
    // The caller's handles let go now; the write keeps the buffer (through the views it
    // holds) and the pool takes the buffer back once the write is settled.
    release(g);
    g.where = Where::kWriting;
    if (!options_.pipeline_write) settle_writes();
  }

  void synchronize() {
    std::optional<aio::AioError> first;
    try {
      settle_reads();
    } catch (const aio::AioError& e) {
      first = e;
    }
    settle_writes();
    if (first) throw *first;
  }

  void swap_in_all() {
    synchronize();
    // Sub-groups in a pool buffer go out first, so that every swapped one is read the same way.
    for (size_t id = 0; id < groups_.size(); ++id) {
      if (groups_[id].where == Where::kInMemory) swap_out(static_cast<int>(id));
    }
    settle_writes();
    std::vector<std::pair<Entry*, at::Tensor>> targets;
    try {
      for (size_t id = 0; id < groups_.size(); ++id) {
        SubGroup& g = groups_[id];
        if (g.where != Where::kOnDisk) continue;
        for (auto& e : g.entries) {
          at::Tensor own = aio::new_aligned_tensor(e.numel, e.dtype);
          read_.async_pread(own, path(static_cast<int>(id), e.name));
          targets.emplace_back(&e, own);
        }
        reads_ += static_cast<int64_t>(g.entries.size());
      }
      read_.wait();
    } catch (const aio::AioError& err) {
      wait_all(read_);
      throw aio::AioError(std::string(err.what()) +
                          " (while swapping in all optimizer state for a checkpoint)");
    }
    for (auto& [e, own] : targets) e->tensor.set_data(own.view(e->sizes));
    for (auto& g : groups_) {
      if (g.where == Where::kOnDisk) g.where = Where::kHeld;
    }
  }

  void swap_out_all() {
    try {
      for (size_t id = 0; id < groups_.size(); ++id) {
        SubGroup& g = groups_[id];
        if (g.where != Where::kHeld) continue;
        for (const auto& e : g.entries) {
          // The caller may have re-pointed a handle at memory of its own (a load copies into
          // them): a bounce copy keeps O_DIRECT's alignment.
          at::Tensor src = e.tensor.reshape({-1});
          if (!aio::is_aligned(src) || !src.is_contiguous()) {
            at::Tensor aligned = aio::new_aligned_tensor(e.numel, e.dtype);
            aligned.copy_(src);
            src = aligned;
          }
          write_.async_pwrite(src, path(static_cast<int>(id), e.name));
        }
        writes_ += static_cast<int64_t>(g.entries.size());
      }
      write_.wait();
    } catch (const aio::AioError& err) {
      wait_all(write_);
      throw aio::AioError(std::string(err.what()) +
                          " (while swapping out all optimizer state after a checkpoint)");
    }
    for (auto& g : groups_) {
      if (g.where != Where::kHeld) continue;
      release(g);
      g.where = Where::kOnDisk;
    }
  }

  void step_sub_groups(const std::function<void(int)>& step) {
    const int n = static_cast<int>(groups_.size());
    for (int k = 0; k < n; ++k) {
      swap_in(k);
      prefetch(k + 1);
      step(k);
      swap_out(k);
    }
  }

  SubGroup& group(int id) {
    DS_CHECK(id >= 0 && id < static_cast<int>(groups_.size()), UsageError,
             "optimizer swapper: no sub-group ", id, " (", groups_.size(), " registered)");
    return groups_[static_cast<size_t>(id)];
  }

  std::string path(int id, const std::string& name) const {
    return folder_ + "/" + std::to_string(id) + "_" + name + ".tensor.swp";
  }

  int64_t bytes(bool swappable) const {
    int64_t total = 0;
    for (const auto& g : groups_) {
      if ((g.where != Where::kResident) == swappable) total += g.bytes;
    }
    return total;
  }

  SwapperOptions options_;
  std::string folder_;
  std::unique_ptr<SwapFolderLock> lock_;  // released after ~Impl removed the files
  int64_t min_swap_bytes_ = 0;
  aio::AioHandle read_;
  aio::AioHandle write_;
  std::vector<SubGroup> groups_;
  int64_t largest_bytes_ = 0;
  std::unique_ptr<SwapBufferPool> pool_;
  int64_t reads_ = 0;
  int64_t writes_ = 0;

 private:
  static void release(SubGroup& g) {
    for (auto& e : g.entries) e.tensor.set_data(at::empty({0}, e.tensor.options()));
  }

  int acquire_buffer(bool required) {
    if (!pool_) pool_ = std::make_unique<SwapBufferPool>(options_.buffer_count, largest_bytes_);
    if (!pool_->any_free()) settle_writes();
    const int b = pool_->acquire();
    DS_CHECK(b >= 0 || !required, ConfigError,
             "zero_optimization.offload_optimizer.buffer_count (", options_.buffer_count,
             ") buffers are all holding sub-groups; swap some out first or raise buffer_count");
    return b;
  }

  void start_read(int id, bool required) {
    const int b = acquire_buffer(required);
    if (b < 0) return;  // read-ahead without a free buffer: the read happens at swap_in
    SubGroup& g = group(id);
    g.buffer = b;
    g.where = Where::kReading;
    try {
      for (auto& e : g.entries) {
        read_.async_pread(pool_->view(b, e.offset, e.numel, e.dtype), path(id, e.name));
      }
    } catch (const aio::AioError& err) {
      wait_all(read_);  // let the reads already started finish before the buffer goes back
      pool_->release(b);
      g.buffer = -1;
      g.where = Where::kOnDisk;
      throw aio::AioError(std::string(err.what()) + " (while swapping in optimizer sub-group " +
                          std::to_string(id) + ")");
    }
    reads_ += static_cast<int64_t>(g.entries.size());
  }

  // Every read in flight is done: point their tensors at the buffers.
  void settle_reads() {
    const std::optional<aio::AioError> failure = wait_all(read_);
    for (auto& g : groups_) {
      if (g.where != Where::kReading) continue;
      if (failure) {
        pool_->release(g.buffer);
        g.buffer = -1;
        g.where = Where::kOnDisk;
        continue;
      }
      for (auto& e : g.entries) {
        e.tensor.set_data(pool_->view(g.buffer, e.offset, e.numel, e.dtype).view(e.sizes));
      }
      g.where = Where::kInMemory;
    }
    if (failure) {
      throw aio::AioError(std::string(failure->what()) +
                          " (while swapping in optimizer state)");
    }
  }

  // Every write in flight is done: their buffers go back to the pool.
  void settle_writes() {
    const std::optional<aio::AioError> failure = wait_all(write_);
    for (auto& g : groups_) {
      if (g.where != Where::kWriting) continue;
      pool_->release(g.buffer);
      g.buffer = -1;
      // A failed write leaves a file that cannot be trusted; reading it back fails loudly
      // (wrong size) or, worse, returns stale bytes, so the failure is reported now.
      g.where = Where::kOnDisk;
    }
    if (failure) {
      throw aio::AioError(std::string(failure->what()) +
                          " (while swapping out optimizer state: that sub-group's state is lost)");
    }
  }
};

OptimizerSwapper::OptimizerSwapper(SwapperOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {}
OptimizerSwapper::~OptimizerSwapper() = default;

int OptimizerSwapper::add_sub_group(std::vector<NamedTensor> tensors) {
  return impl_->add(std::move(tensors));
}
void OptimizerSwapper::swap_in(int id) { impl_->swap_in(id); }
void OptimizerSwapper::prefetch(int id) { impl_->prefetch(id); }
void OptimizerSwapper::swap_out(int id) { impl_->swap_out(id); }
void OptimizerSwapper::synchronize() { impl_->synchronize(); }
void OptimizerSwapper::swap_in_all() { impl_->swap_in_all(); }
void OptimizerSwapper::swap_out_all() { impl_->swap_out_all(); }
void OptimizerSwapper::step_sub_groups(const std::function<void(int)>& step) {
  impl_->step_sub_groups(step);
}
int OptimizerSwapper::num_sub_groups() const { return static_cast<int>(impl_->groups_.size()); }
bool OptimizerSwapper::swappable(int id) const {
  return impl_->group(id).where != Where::kResident;
}
bool OptimizerSwapper::in_memory(int id) const {
  const Where w = impl_->group(id).where;
  return w == Where::kResident || w == Where::kInMemory || w == Where::kHeld;
}
const std::string& OptimizerSwapper::swap_folder() const { return impl_->folder_; }
std::string OptimizerSwapper::swap_path(int id, const std::string& name) const {
  return impl_->path(id, name);
}
int64_t OptimizerSwapper::swapped_bytes() const { return impl_->bytes(/*swappable=*/true); }
int64_t OptimizerSwapper::resident_bytes() const { return impl_->bytes(/*swappable=*/false); }
int64_t OptimizerSwapper::buffer_bytes() const {
  return impl_->pool_ ? impl_->pool_->allocated_bytes() : 0;
}
int64_t OptimizerSwapper::reads() const { return impl_->reads_; }
int64_t OptimizerSwapper::writes() const { return impl_->writes_; }
int64_t OptimizerSwapper::writes_in_flight() const { return impl_->write_.pending(); }

}  // namespace deepspeed::runtime::swap
