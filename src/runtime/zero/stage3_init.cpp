// zero::Init, partitioned construction (deepspeed/zero3.h), and the registry of the shards it
// cut, which the stage-3 engine takes over (stage3_init.h).
#include "runtime/zero/stage3_init.h"

#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include <ATen/ATen.h>
#include <c10/util/intrusive_ptr.h>

#include "deepspeed/auto_ep.h"
#include "deepspeed/comm.h"
#include "deepspeed/linear.h"
#include "deepspeed/mpu.h"
#include "deepspeed/zero3.h"
#include "runtime/host_caching_allocator.h"
#include "runtime/zero/stage3_groups.h"
#include "runtime/zero/stage3_param.h"
#include "util/check.h"
#include "util/env.h"

namespace deepspeed::runtime {
namespace {

struct Entry {
  // Weak: a model dropped before any engine took it must not leave a key that a new tensor at
  // the same address would match.
  c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl> tensor;
  PrePartitioned shard;
};

std::mutex& mutex() {
  static std::mutex m;
  return m;
}

std::unordered_map<const c10::TensorImpl*, Entry>& entries() {
  static std::unordered_map<const c10::TensorImpl*, Entry> e;
  return e;
}

// Caller holds the mutex. Drops the entry if its tensor is gone; returns it otherwise.
Entry* find_live(const at::Tensor& param) {
  auto it = entries().find(param.unsafeGetTensorImpl());
  if (it == entries().end()) return nullptr;
  if (it->second.tensor.lock().get() != param.unsafeGetTensorImpl()) {
    entries().erase(it);
    return nullptr;
  }
  return &it->second;
}

void remember(const at::Tensor& param, PrePartitioned shard) {
  std::lock_guard<std::mutex> lock(mutex());
  for (auto it = entries().begin(); it != entries().end();) {
    it = it->second.tensor.expired() ? entries().erase(it) : std::next(it);
  }
  entries().insert_or_assign(
      param.unsafeGetTensorImpl(),
      Entry{c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>(
                param.getIntrusivePtr()),
            std::move(shard)});
}

thread_local zero::Init* active_init = nullptr;

}  // namespace

std::optional<PrePartitioned> take_pre_partitioned(const at::Tensor& param) {
  std::lock_guard<std::mutex> lock(mutex());
  Entry* e = find_live(param);
  if (e == nullptr) return std::nullopt;
  PrePartitioned out = std::move(e->shard);
  entries().erase(param.unsafeGetTensorImpl());
  return out;
}

bool is_pre_partitioned(const at::Tensor& param) {
  std::lock_guard<std::mutex> lock(mutex());
  return find_live(param) != nullptr;
}

}  // namespace deepspeed::runtime

namespace deepspeed::zero {

Init::Init(const DeepSpeedConfig& config, std::shared_ptr<Mpu> mpu) {
  const auto& z = config.zero_optimization;
  DS_CHECK(z.stage == 3, ConfigError, config.source,
           ": zero::Init partitions parameters for ZeRO stage 3, but zero_optimization.stage is ",
           z.stage);
  comm::init_distributed();
  dp_group_ = mpu ? mpu->get_data_parallel_group() : comm::world();
  // MiCS (DeepSpeed's MiCS_Init): broadcast over the data-parallel group, cut for a shard group.
  if (auto mics = runtime::make_mics_groups(config, dp_group_, mpu != nullptr)) {
    shard_group_ = mics->shard;
  } else {
    shard_group_ = dp_group_;
  }
  // The shards are made here, before the engine exists: through the engine's allocator, so that
  // memory given back later (NVMe offload swaps them out) is unmapped, not kept by glibc's heap.
  if (env::get_int("DS_HOST_CACHING_ALLOCATOR").value_or(1) != 0) {
    runtime::install_host_caching_allocator();
  }
  dtype_ = config.fp16.enabled ? at::kHalf : config.bf16.enabled ? at::kBFloat16 : at::kFloat;
  persistence_threshold_ = z.stage3_param_persistence_threshold;
  previous_ = runtime::active_init;
  runtime::active_init = this;
}

Init::~Init() { runtime::active_init = previous_; }

void Init::partition(torch::nn::Module& module) {
  const int world = shard_group_.size();
  const int rank = shard_group_.rank();
  at::NoGradGuard no_grad;
  // AutoEP's sharded experts stay whole: the engine cuts them for their expert-data-parallel
  // group (Note [Expert partitions] in stage3_param.h).
  // (A unit under construction is not in a shared_ptr yet: its descendants and itself apart.)
  std::unordered_set<const c10::TensorImpl*> experts;
  auto note_experts = [&](const torch::nn::Module& m) {
    const auto* layer = dynamic_cast<const moe::TokenChoiceMoEImpl*>(&m);
    if (layer == nullptr || layer->ep_groups() == nullptr) return;
    for (const auto& w : layer->expert_parameters()) experts.insert(w.unsafeGetTensorImpl());
  };
  note_experts(module);
  for (const auto& m : module.modules(/*include_self=*/false)) note_experts(*m);
  for (auto& p : module.parameters(/*recurse=*/true)) {
    if (p.numel() == 0 || runtime::is_pre_partitioned(p)) continue;
    if (experts.count(p.unsafeGetTensorImpl())) continue;
    DS_CHECK(!linear::is_sharded_base_weight(p), NotSupportedError,
             "ZeRO-3 with an OptimizedLinear whose LoRAConfig.base_weight_sharding is above 1 is "
             "not supported: each rank holds a different shard of the base weight, which ZeRO-3 "
             "would partition again as if it were whole (use base_weight_sharding 1 with ZeRO-3, "
             "or ZeRO 0-2)");
    at::Tensor handle = p;  // set_data and storage changes act on the shared TensorImpl
    // Matches DeepSpeed's zero.Init: floating parameters are created in the training dtype.
    if (p.is_floating_point() && p.scalar_type() != dtype_) handle.set_data(p.detach().to(dtype_));
    runtime::ensure_own_storage(handle);
    const int64_t numel = p.numel();
    at::Tensor full = runtime::storage_as_flat(handle, numel);
    // Every data-parallel rank starts from its group's first rank's values.
    if (dp_group_.size() > 1) comm::broadcast(full, dp_group_.global_rank(0), false, dp_group_);
    if (numel <= persistence_threshold_) continue;  // stays whole (persistent)
    const int64_t shard = runtime::shard_numel_for(numel, world);
    at::Tensor mine = at::zeros({shard}, full.options());
    const int64_t begin = std::min<int64_t>(numel, static_cast<int64_t>(rank) * shard);
    const int64_t len = std::min<int64_t>(shard, numel - begin);
    if (len > 0) mine.narrow(0, 0, len).copy_(full.narrow(0, begin, len));
    full = at::Tensor();
    runtime::free_storage(handle);
    runtime::remember(handle, runtime::PrePartitioned{mine, world});
    partitioned_numel_ += numel;
    shard_numel_ += shard;
  }
}

namespace detail {

void on_unit_constructed(torch::nn::Module& module) {
  if (runtime::active_init != nullptr) runtime::active_init->partition(module);
}

}  // namespace detail
}  // namespace deepspeed::zero
