// Keeping and restoring checkpointed inputs (see saved_inputs.h).
#include "runtime/activation_checkpointing/saved_inputs.h"

#include <torch/cuda.h>
#include <torch/torch.h>

#include <mutex>

#include "util/check.h"

namespace deepspeed::checkpointing::detail {
namespace {

// Matches DeepSpeed's contiguous checkpointing: for the i-th checkpointed input of each call, one
// buffer with number_checkpoints slots of that input's partition, filled call after call until
// the next backward drops them (checkpointing.py keeps the same per-index lists).
struct ContiguousBuffers {
  std::mutex mutex;
  std::vector<at::Tensor> buffers;  // [number_checkpoints * slot_numel] each
  std::vector<int64_t> next_slot;
};

ContiguousBuffers& contiguous() {
  static ContiguousBuffers buffers;
  return buffers;
}

at::TensorOptions host_options(const at::Tensor& like) {
  // Pinned memory needs a CUDA context; it is what makes the copy back asynchronous-capable.
  return like.options().device(at::kCPU).pinned_memory(torch::cuda::is_available());
}

// Copies `part` (flat) into the next slot of the contiguous buffer for checkpointed input
// `index` and returns the slot.
at::Tensor into_contiguous_slot(const at::Tensor& part, size_t index, const Options& options) {
  auto& c = contiguous();
  std::lock_guard<std::mutex> lock(c.mutex);
  const int64_t slots = options.number_checkpoints.value_or(0);
  if (index >= c.buffers.size()) {
    c.buffers.resize(index + 1);
    c.next_slot.resize(index + 1, 0);
  }
  if (!c.buffers[index].defined()) {
    const auto buffer_options = options.cpu_checkpointing ? host_options(part) : part.options();
    c.buffers[index] = at::empty({slots * part.numel()}, buffer_options);
    c.next_slot[index] = 0;
  }
  const at::Tensor& buffer = c.buffers[index];
  const int64_t slot_numel = buffer.numel() / std::max<int64_t>(slots, 1);
  DS_CHECK(part.numel() == slot_numel && part.scalar_type() == buffer.scalar_type(), UsageError,
           "activation_checkpointing.contiguous_memory_optimization: checkpointed input ", index,
           " keeps ", part.numel(), " ", part.scalar_type(),
           " elements per rank, but its buffer's "
           "slots hold ",
           slot_numel, " ", buffer.scalar_type(),
           " (sized by the first call); "
           "contiguous checkpointing needs every checkpointed call to take inputs of the same "
           "sizes and dtypes, so turn it off for this model");
  DS_CHECK(c.next_slot[index] < slots, UsageError,
           "activation_checkpointing.contiguous_memory_optimization: checkpoint call ",
           c.next_slot[index] + 1, " since the last backward, but number_checkpoints is ", slots,
           "; set number_checkpoints to the number of checkpointed calls per forward, or call "
           "checkpointing::reset() after forwards that have no backward");
  at::Tensor slot = buffer.narrow(0, c.next_slot[index] * slot_numel, slot_numel);
  slot.copy_(part);
  ++c.next_slot[index];
  count(&Stats::contiguous_copies);
  return slot;
}

}  // namespace

bool is_activation_to_checkpoint(const at::Tensor& t, int mp_size) {
  return t.defined() && t.is_floating_point() && t.numel() >= mp_size;
}

void clear_contiguous_buffers() {
  auto& c = contiguous();
  std::lock_guard<std::mutex> lock(c.mutex);
  c.buffers.clear();
  c.next_slot.clear();
}

SavedInputs::SavedInputs(const std::vector<at::Tensor>& inputs, const Options& options,
                         const ModelParallel& mp)
    : mp_(mp) {
  size_t checkpointed = 0;  // index among the checkpointed inputs (the contiguous buffer's)
  for (size_t i = 0; i < inputs.size(); ++i) {
    const at::Tensor& x = inputs[i];
    Entry e;
    if (!x.defined()) {
      entries_.push_back(std::move(e));
      continue;
    }
    e.sizes = x.sizes().vec();
    e.device = x.device();
    e.requires_grad = x.requires_grad();
    if (!is_activation_to_checkpoint(x, mp.size)) {
      e.data = x.detach();
    } else if (options.partition_activations) {
      DS_CHECK(x.numel() % mp.size == 0, UsageError,
               "activation_checkpointing.partition_activations: checkpointed input ", i, " has ",
               x.numel(), " elements, which does not divide by the model-parallel size ", mp.size,
               (mp.group.valid() ? " (group " + mp.group.describe() + ")" : std::string()),
               "; make its size a multiple of ", mp.size, " or turn partition_activations off");
      const int64_t part_numel = x.numel() / mp.size;
      at::Tensor part =
          x.detach().contiguous().view({-1}).narrow(0, mp.rank * part_numel, part_numel);
      if (options.contiguous_memory_optimization) {
        part = into_contiguous_slot(part, checkpointed, options);
      } else if (options.cpu_checkpointing) {
        part = at::empty({part_numel}, host_options(part)).copy_(part);
        count(&Stats::host_copies);
      } else {
        part = part.clone();  // a slice alone must not keep the whole input alive
      }
      e.data = part;
      e.partitioned = true;
      count(&Stats::partitioned_inputs);
      ++checkpointed;
    } else if (options.cpu_checkpointing) {
      e.data = at::empty(x.sizes(), host_options(x)).copy_(x.detach());
      count(&Stats::host_copies);
      ++checkpointed;
    } else {
      e.data = x.detach();
      ++checkpointed;
    }
    bytes_ += static_cast<int64_t>(e.data.numel() * e.data.element_size());
    entries_.push_back(std::move(e));
  }
  account_saved_bytes(bytes_);
}

SavedInputs::~SavedInputs() { account_saved_bytes(-bytes_); }

std::vector<at::Tensor> SavedInputs::restore() const {
  std::vector<at::Tensor> out;
  out.reserve(entries_.size());
  for (const Entry& e : entries_) {
    if (!e.data.defined()) {
      out.emplace_back();
      continue;
    }
    at::Tensor x;
    if (e.partitioned) {
      at::Tensor part = e.data.to(e.device);
      if (mp_.size == 1) {
        x = part.view(e.sizes);
      } else {
        at::Tensor flat = at::empty({part.numel() * mp_.size}, part.options());
        comm::all_gather(flat, part.contiguous(), /*async_op=*/false, mp_.group);
        x = flat.view(e.sizes);
        count(&Stats::gathered_inputs);
      }
    } else {
      x = e.data.to(e.device);
    }
    // The device copy of a host copy is fresh; a referenced input is detached from the caller's
    // graph so that the recomputation builds its own.
    out.push_back(x.detach().requires_grad_(e.requires_grad));
  }
  return out;
}

}  // namespace deepspeed::checkpointing::detail
