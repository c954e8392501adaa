// PartitionedParam: storage release and gather (see Note [Release by storage resize]).
#include "runtime/zero/stage3_param.h"

#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/StorageImpl.h>

#include "runtime/zero/block_quantizer.h"
#include "util/check.h"

namespace deepspeed::runtime {
namespace {

c10::StorageImpl* storage_of(const at::Tensor& t) {
  return t.unsafeGetTensorImpl()->storage().unsafeGetStorageImpl();
}

void resize_storage_bytes(const at::Tensor& t, size_t nbytes) {
  c10::StorageImpl* s = storage_of(t);
  if (s->nbytes() == nbytes) return;
  DS_INTERNAL_ASSERT(s->allocator() != nullptr, "a ZeRO-3 parameter's storage has no allocator");
  // On CPU, the allocator in force now (the engine's host caching allocator, which maps large
  // blocks and gives them back) rather than the one the parameter was created with: glibc's
  // heap keeps freed blocks of a gather-release cycle mapped once its mmap threshold has grown.
  c10::Allocator* allocator = s->device().is_cpu() ? c10::GetCPUAllocator() : s->allocator();
  at::DataPtr fresh = nbytes > 0 ? allocator->allocate(nbytes) : at::DataPtr(nullptr, s->device());
  s->set_data_ptr_noswap(std::move(fresh));
  s->set_nbytes(nbytes);
}

// Note [Offloaded shards to the device]
// With offload_param on a GPU a shard is pinned host memory. Its host-to-device copy runs on a
// side stream ordered after the compute stream (the gathered storage was just allocated there,
// and the caching allocator may hand out a block that queued kernels still use): a prefetch then
// copies while the compute stream goes on, and the compute stream waits only when it needs the
// parameter (finish_gather). With several ranks the all-gather is launched from the side stream
// too, so NCCL waits for the copy and not for the compute stream. The host must not rewrite a
// shard while a copy may still read it: wait_for_shard_copies() first.
struct ShardCopyStreams {
  std::mutex mutex;
  std::map<c10::DeviceIndex, std::unique_ptr<SideStream>> streams;  // one per device
};

ShardCopyStreams& shard_copy_streams() {
  static ShardCopyStreams s;
  return s;
}

SideStream& shard_copy_stream(const c10::Device& device) {
  ShardCopyStreams& s = shard_copy_streams();
  std::lock_guard<std::mutex> lock(s.mutex);
  auto& stream = s.streams[device.index()];
  if (!stream) stream = std::make_unique<SideStream>(device);
  return *stream;
}

// The dtype `p`'s shard holds (that of the values it reads back when kept quantized).
at::ScalarType shard_dtype(const PartitionedParam& p) {
  return p.kept_quantized() ? p.param.scalar_type() : p.shard.scalar_type();
}

// The dtype `p`'s shards travel in when gathered (Note [Gather dtype]); a quantized shard
// travels as it is kept (Note [Quantized frozen shards]).
at::ScalarType wire_dtype(const PartitionedParam& p) {
  if (p.kept_quantized()) return shard_dtype(p);
  return p.gather_dtype != at::ScalarType::Undefined ? p.gather_dtype : p.shard.scalar_type();
}

bool converts(const PartitionedParam& p) { return wire_dtype(p) != shard_dtype(p); }

// Note [Secondary partition]: whether `p`'s next gather reads the H ranks' secondary partitions.
bool from_secondary(const PartitionedParam& p, const ShardGroup& group) {
  return group.secondary.valid() && p.secondary.defined();
}

}  // namespace

void wait_for_shard_copies() {
  ShardCopyStreams& s = shard_copy_streams();
  std::lock_guard<std::mutex> lock(s.mutex);
  for (auto& [device, stream] : s.streams) stream->synchronize();
}

void ensure_own_storage(const at::Tensor& param) {
  const auto bytes = static_cast<size_t>(param.numel()) * param.element_size();
  const bool own = param.is_contiguous() && param.storage_offset() == 0 &&
                   storage_of(param)->nbytes() == bytes && storage_of(param)->allocator() &&
                   param.storage().use_count() == 1;
  if (own) return;
  at::NoGradGuard no_grad;
  at::Tensor handle = param;  // set_data acts on the shared TensorImpl
  handle.set_data(param.detach().clone(at::MemoryFormat::Contiguous));
}

bool storage_is_allocated(const at::Tensor& param) {
  return storage_of(param)->nbytes() > 0 || param.numel() == 0;
}

at::Tensor storage_as_flat(const at::Tensor& param, int64_t numel) {
  const auto bytes = static_cast<size_t>(numel) * param.element_size();
  if (storage_of(param)->nbytes() < bytes) resize_storage_bytes(param, bytes);
  at::NoGradGuard no_grad;
  at::Tensor flat = at::empty({0}, at::TensorOptions().dtype(param.dtype()).device(param.device()));
  flat.set_(param.storage(), 0, {numel}, {1});
  return flat;
}

void free_storage(const at::Tensor& param) { resize_storage_bytes(param, 0); }

comm::Handle all_gather_shards(at::Tensor& output, const at::Tensor& input, bool async,
                               const ShardGroup& group) {
  if (!group.intra_node.valid()) return comm::all_gather(output, input, async, group.group);
  // Note [Hierarchical gather]
  const int64_t nodes = group.inter_node.size();
  const int64_t per_node = group.intra_node.size();
  const int64_t n = input.numel();
  at::Tensor across = at::empty({nodes * n}, input.options());
  comm::all_gather(across, input.reshape({-1}), /*async_op=*/false, group.inter_node);
  at::Tensor within = at::empty({per_node * nodes * n}, input.options());
  comm::all_gather(within, across, /*async_op=*/false, group.intra_node);
  // within[l][k] is the shard of node k's local rank l: shard rank k * L + l.
  output.view({nodes, per_node, n}).copy_(within.view({per_node, nodes, n}).transpose(0, 1));
  return comm::Handle();
}

void start_gather(PartitionedParam& p, const ShardGroup& group, bool async, bool use_all_reduce) {
  const int world = group.size();
  const int rank = group.rank();
  if (p.available || p.numel == 0) {
    p.available = true;
    return;
  }
  at::NoGradGuard no_grad;
  at::Tensor full = storage_as_flat(p.param, p.padded_numel(world));
  if (from_secondary(p, group)) {  // Note [Secondary partition]
    p.inflight = comm::all_gather(full, p.secondary, async, group.secondary);
    p.gather_target = full;
    p.available = true;
    if (!async) finish_gather(p);
    return;
  }
  if (p.kept_quantized()) {  // Note [Quantized frozen shards]
    DS_INTERNAL_ASSERT(world == 1, "a quantized shard gathers through start_gathers");
    full.copy_(shard_values(p));
    p.available = true;
    return;
  }
  // offload_param with the model on a GPU (Note [Offloaded shards to the device]).
  const bool from_host = p.shard.is_cpu() && !full.is_cpu();
  if (world == 1 && converts(p)) {
    full.copy_(p.shard.to(full.device(), wire_dtype(p)));  // Note [Gather dtype]
  } else if (world == 1 && from_host) {
    p.copied = shard_copy_stream(full.device()).enqueue_marked([&] {
      full.copy_(p.shard, /*non_blocking=*/true);
    });
  } else if (world == 1) {
    full.copy_(p.shard);
  } else if (use_all_reduce) {
    full.zero_();
    full.narrow(0, static_cast<int64_t>(rank) * p.shard_numel, p.shard_numel).copy_(p.shard);
    p.inflight = comm::all_reduce(full, comm::ReduceOp::kSum, async, group.group);
  } else if (from_host) {
    // NCCL gathers device memory: the shard crosses first, and the all-gather waits for that
    // copy alone. Launched asynchronously; finish_gather makes the compute stream wait for it.
    shard_copy_stream(full.device()).enqueue_after_current([&] {
      const at::Tensor mine = p.shard.to(full.device(), /*non_blocking=*/true);
      p.inflight = comm::all_gather(full, mine, /*async_op=*/true, group.group);
    });
  } else {
    p.inflight = all_gather_shards(full, p.shard, async, group);
  }
  p.gather_target = full;
  p.available = true;
  if (!async) finish_gather(p);
}

// Note [Coalesced gathers]. `output` is rank-major: row r holds rank r's shards in `targets`'
// order, so a parameter's column block is its padded storage viewed as [world, shard].
struct CoalescedGather {
  struct Target {
    at::Tensor full;  // the parameter's flat padded storage
    int64_t offset = 0;
    int64_t shard_numel = 0;
    // Note [Quantized frozen shards]: this target's own blocks in the rows: values from
    // `offset` (`value_bytes` of them) and steps from `scale_offset` (`groups`).
    int64_t value_bytes = 0;
    int64_t scale_offset = 0;
    int64_t groups = 0;
  };
  comm::Handle handle;
  at::Tensor input;   // this rank's shards, concatenated (kept until the collective is done)
  at::Tensor output;  // [world, S]; quantized: int8 [world, G * g], S <= G * g
  // Note [Quantized gather]: the groups' steps travel in a second collective.
  comm::Handle scales_handle;
  at::Tensor input_scales;
  at::Tensor output_scales;  // [world, G]; undefined when not quantized
  bool per_target_blocks = false;  // Note [Quantized frozen shards]: each target's own groups
  std::vector<Target> targets;

  // Waits once, then fills every target (the first of the parameters to be finished does it).
  void finish() {
    for (comm::Handle* h : {&handle, &scales_handle}) {
      if (!h->valid()) continue;
      h->wait();
      *h = comm::Handle();
    }
    if (targets.empty()) return;
    at::NoGradGuard no_grad;
    const int64_t world = output.size(0);
    if (per_target_blocks) {
      for (auto& t : targets) {
        const at::Tensor rows = dequantize_blocks(
            output.narrow(1, t.offset, t.value_bytes).contiguous(),
            output_scales.narrow(1, t.scale_offset, t.groups).contiguous(),
            t.full.scalar_type());
        t.full.view({world, t.shard_numel}).copy_(rows.narrow(1, 0, t.shard_numel));
      }
    } else if (output_scales.defined()) {
      // One rank's row at a time: the temporary is 1/world of the gathered parameters.
      for (int64_t r = 0; r < world; ++r) {
        const at::Tensor row = dequantize_blocks(output.narrow(0, r, 1),
                                                 output_scales.narrow(0, r, 1),
                                                 targets.front().full.scalar_type())[0];
        for (auto& t : targets) {
          t.full.view({world, t.shard_numel})[r].copy_(row.narrow(0, t.offset, t.shard_numel));
        }
      }
    } else {
      for (auto& t : targets) {
        t.full.view({world, t.shard_numel}).copy_(output.narrow(1, t.offset, t.shard_numel));
      }
    }
    targets.clear();
    input = at::Tensor();
    output = at::Tensor();
    input_scales = at::Tensor();
    output_scales = at::Tensor();
  }
};

namespace {

bool coalescable(const PartitionedParam& p, const ShardGroup& group) {
  const int world = group.size();
  if (from_secondary(p, group)) {
    return !p.available && p.numel > 0 &&
           (group.quantize_weights ||
            p.secondary.numel() * static_cast<int64_t>(p.secondary.element_size()) <=
                kCoalesceShardBytes);
  }
  if (world == 1 || p.available || p.numel == 0) return false;
  // Note [Gather dtype], Note [Quantized gather] and Note [Quantized frozen shards]: converted
  // on the way.
  if (converts(p) || group.quantize_weights || p.kept_quantized()) return true;
  const bool from_host = p.shard.is_cpu() && !p.param.is_cpu();  // a side-stream copy first
  return !from_host &&
         p.shard_numel * static_cast<int64_t>(p.shard.element_size()) <= kCoalesceShardBytes;
}

// `secondary`: the batch gathers secondary partitions over group.secondary (Note [Secondary
// partition]), in the parameters' dtype; each parameter's storage is padded for all W ranks
// either way (H secondary partitions make the same padded size).
void start_coalesced(const std::vector<PartitionedParam*>& batch, const ShardGroup& group,
                     bool async, bool use_all_reduce, bool secondary) {
  at::NoGradGuard no_grad;
  const int world = secondary ? group.secondary.size() : group.size();
  auto gather = std::make_shared<CoalescedGather>();
  std::vector<at::Tensor> shards;
  int64_t total = 0;
  for (PartitionedParam* p : batch) {
    const at::Tensor& source = secondary ? p->secondary : p->shard;
    at::Tensor full = storage_as_flat(p->param, p->padded_numel(group.size()));
    gather->targets.push_back({full, total, source.numel()});
    shards.push_back(source.view({-1}));
    total += source.numel();
  }
  // Every rank's rows into `out` ([world, n]), from `in` (n elements).
  auto gather_rows = [&](at::Tensor& out, const at::Tensor& in) {
    at::Tensor flat = out.view({-1});
    return secondary ? comm::all_gather(flat, in, async, group.secondary)
                     : all_gather_shards(flat, in, async, group);
  };
  gather->input = at::cat(shards);
  // Note [Gather dtype]: torch_autocast gathers a lower-precision module's shards in its dtype
  // (DeepSpeed's get_allgather_dtype), every rank's own shard included; the parameter then
  // holds the rounded values in its own dtype. Such shards always take this path, which
  // converts (and brings offloaded shards to the parameter's device) before the collective.
  // Secondary partitions are already in the parameters' dtype, on their device.
  const PartitionedParam& first = *batch.front();
  if (!secondary) gather->input = gather->input.to(first.param.device(), wire_dtype(first));
  if (group.quantize_weights) {  // Note [Quantized gather]
    QuantizedBlocks q = quantize_blocks(gather->input);
    gather->input = q.values;
    gather->input_scales = q.scales;
    gather->output = at::empty({world, q.values.numel()}, q.values.options());
    gather->output_scales = at::empty({world, q.scales.numel()}, q.scales.options());
    gather->handle = gather_rows(gather->output, gather->input);
    gather->scales_handle = gather_rows(gather->output_scales, gather->input_scales);
  } else if (use_all_reduce && !secondary) {  // stage3_use_all_reduce_for_fetch_params
    gather->output = at::zeros({world, total}, gather->input.options());
    gather->output.select(0, group.rank()).copy_(gather->input);
    at::Tensor flat = gather->output.view({-1});
    gather->handle = comm::all_reduce(flat, comm::ReduceOp::kSum, async, group.group);
  } else {
    gather->output = at::empty({world, total}, gather->input.options());
    gather->handle = gather_rows(gather->output, gather->input);
  }
  for (PartitionedParam* p : batch) {
    p->available = true;
    p->coalesced = async ? gather : nullptr;
  }
  if (!async) gather->finish();
}

// Note [Quantized frozen shards]: every rank's kept blocks of `batch` in two collectives (the
// values, the steps), each parameter read back from its own columns.
void start_quantized_shards(const std::vector<PartitionedParam*>& batch, const ShardGroup& group,
                            bool async) {
  at::NoGradGuard no_grad;
  const int world = group.size();
  auto gather = std::make_shared<CoalescedGather>();
  gather->per_target_blocks = true;
  std::vector<at::Tensor> values, scales;
  int64_t value_total = 0, scale_total = 0;
  for (PartitionedParam* p : batch) {
    CoalescedGather::Target t;
    t.full = storage_as_flat(p->param, p->padded_numel(world));
    t.offset = value_total;
    t.shard_numel = p->shard_numel;
    t.value_bytes = p->quantized.values.numel();
    t.scale_offset = scale_total;
    t.groups = p->quantized.scales.numel();
    value_total += t.value_bytes;
    scale_total += t.groups;
    gather->targets.push_back(std::move(t));
    values.push_back(p->quantized.values);
    scales.push_back(p->quantized.scales);
  }
  // Offloaded shards cross to the parameters' device first.
  const at::Device device = batch.front()->param.device();
  gather->input = at::cat(values).to(device);
  gather->input_scales = at::cat(scales).to(device);
  gather->output = at::empty({world, value_total}, gather->input.options());
  gather->output_scales = at::empty({world, scale_total}, gather->input_scales.options());
  at::Tensor out_values = gather->output.view({-1});
  at::Tensor out_scales = gather->output_scales.view({-1});
  gather->handle = all_gather_shards(out_values, gather->input, async, group);
  gather->scales_handle = all_gather_shards(out_scales, gather->input_scales, async, group);
  for (PartitionedParam* p : batch) {
    p->available = true;
    p->coalesced = async ? gather : nullptr;
  }
  if (!async) gather->finish();
}

}  // namespace

void quantize_shard(PartitionedParam& p) {
  if (p.kept_quantized()) return;
  at::NoGradGuard no_grad;
  p.quantized = quantize_blocks(p.shard.reshape({-1}));
  p.shard = at::Tensor();
}

at::Tensor shard_values(const PartitionedParam& p) {
  if (!p.kept_quantized()) return p.shard;
  return dequantize_blocks(p.quantized.values.view({1, -1}), p.quantized.scales.view({1, -1}),
                           p.param.scalar_type())[0]
      .narrow(0, 0, p.shard_numel)
      .clone();
}

void set_shard_values(PartitionedParam& p, const at::Tensor& values) {
  at::NoGradGuard no_grad;
  if (!p.kept_quantized()) {
    p.shard.copy_(values.reshape({-1}));
    return;
  }
  const at::Tensor mine =
      values.reshape({-1}).to(p.quantized.values.device(), p.param.scalar_type());
  if (at::equal(mine, shard_values(p))) return;  // Note [Quantized frozen shards]
  p.quantized = quantize_blocks(mine);
}

int64_t shard_bytes(const PartitionedParam& p) {
  if (!p.kept_quantized()) {
    return p.shard.defined() ? p.shard.numel() * static_cast<int64_t>(p.shard.element_size()) : 0;
  }
  return p.quantized.values.numel() * static_cast<int64_t>(p.quantized.values.element_size()) +
         p.quantized.scales.numel() * static_cast<int64_t>(p.quantized.scales.element_size());
}

int64_t start_gathers(const std::vector<PartitionedParam*>& params, const ShardGroup& group,
                      bool async, bool use_all_reduce) {
  const int world = group.size();
  int64_t collectives = 0;
  // One collective per (shard dtype, gather dtype, from the secondary partitions, kept
  // quantized); two for quantized values and their steps.
  std::map<std::tuple<at::ScalarType, at::ScalarType, bool, bool>,
           std::vector<PartitionedParam*>>
      batches;
  for (PartitionedParam* p : params) {
    const bool secondary = from_secondary(*p, group);
    if (coalescable(*p, group)) {
      const at::ScalarType wire = secondary ? p->secondary.scalar_type() : wire_dtype(*p);
      const bool kept_quantized = !secondary && p->kept_quantized();
      batches[{shard_dtype(*p), wire, secondary, kept_quantized}].push_back(p);
      continue;
    }
    if ((world > 1 || secondary) && !p->available && p->numel > 0) ++collectives;
    start_gather(*p, group, async, use_all_reduce);
  }
  for (auto& [key, batch] : batches) {
    if (std::get<3>(key)) {  // Note [Quantized frozen shards]
      collectives += 2;
      start_quantized_shards(batch, group, async);
      continue;
    }
    collectives += group.quantize_weights ? 2 : 1;  // values and steps (Note [Quantized gather])
    const bool secondary = std::get<2>(key);
    if (batch.size() == 1 && !group.quantize_weights && (secondary || !converts(*batch[0]))) {
      start_gather(*batch[0], group, async, use_all_reduce);
    } else {
      start_coalesced(batch, group, async, use_all_reduce, secondary);
    }
  }
  return collectives;
}

int64_t start_partitioned_gathers(const std::vector<PartitionedParam*>& params,
                                  const std::vector<ShardGroup>& groups, bool async,
                                  bool use_all_reduce) {
  std::vector<std::vector<PartitionedParam*>> by_partition(groups.size());
  for (PartitionedParam* p : params) {
    DS_INTERNAL_ASSERT(p->partition >= 0 && p->partition < static_cast<int>(groups.size()),
                       "parameter '", p->name, "' is cut for partition ", p->partition);
    by_partition[p->partition].push_back(p);
  }
  int64_t collectives = 0;
  for (size_t k = 0; k < groups.size(); ++k) {
    if (!by_partition[k].empty()) {
      collectives += start_gathers(by_partition[k], groups[k], async, use_all_reduce);
    }
  }
  return collectives;
}

void finish_gather(PartitionedParam& p) {
  if (p.coalesced) {
    p.coalesced->finish();
    p.coalesced.reset();
  }
  SideStream::current_waits_for(p.copied);
  p.copied.reset();
  if (p.inflight.valid()) {
    p.inflight.wait();
    p.inflight = comm::Handle();
  }
  p.gather_target = at::Tensor();
}

void keep_secondary(PartitionedParam& p, const ShardGroup& group) {
  if (!group.secondary.valid() || p.secondary.defined() || !p.available || p.numel == 0) return;
  finish_gather(p);
  at::NoGradGuard no_grad;
  const int64_t padded = p.padded_numel(group.size());
  const int64_t n = padded / group.secondary.size();
  const at::Tensor full = storage_as_flat(p.param, padded);
  p.secondary = full.narrow(0, group.secondary.rank() * n, n).clone();
}

void release(PartitionedParam& p) {
  if (!p.available) return;
  finish_gather(p);
  free_storage(p.param);
  p.available = false;
}

}  // namespace deepspeed::runtime
