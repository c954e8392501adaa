// ZeRO stage 3 for custom models: units and partitioned construction. See docs/zero.md "Stage 3".
//
// Under zero_optimization.stage 3 every rank keeps 1/W of each parameter. C++ modules have no
// forward hooks, so the engine gathers parameters per *unit*: a submodule whose parameters are
// all-gathered just before its forward, released after it, gathered again just before its
// backward and released when that ends. Units are
//   - every child of a torch::nn::Sequential (nested Sequentials are walked through), and
//   - every module built as zero::Unit<M> (below), for blocks a custom forward calls itself.
// Parameters registered outside every unit, and small ones (stage3_param_persistence_threshold),
// stay gathered. A parameter may be used only inside the forward of a unit that registers it,
// or anywhere if it is registered outside units.
//
//   struct GPTImpl : torch::nn::Module {
//     GPTImpl() {
//       for (int i = 0; i < 12; ++i)
//         blocks.push_back(register_module("h" + std::to_string(i),
//                                          std::make_shared<zero::Unit<BlockImpl>>(cfg)));
//     }
//     torch::Tensor forward(torch::Tensor x) {
//       for (auto& b : blocks) x = b->forward(x);  // call through the Unit type
//       return x;
//     }
//     std::vector<std::shared_ptr<zero::Unit<BlockImpl>>> blocks;
//   };
//
// Partitioned construction (DeepSpeed's deepspeed.zero.Init): build the model inside a
// zero::Init scope and each zero::Unit partitions its parameters as soon as it is constructed,
// so a rank never holds more than its shards plus the unit being built:
//
//   auto config = deepspeed::load_config("ds_config.json");
//   std::shared_ptr<GPTImpl> model;
//   { deepspeed::zero::Init init(config); model = std::make_shared<GPTImpl>(); }
//   auto [engine, optimizer, scheduler] = deepspeed::initialize(model, config);
#pragma once

#include <cstdint>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include "deepspeed/comm.h"
#include "deepspeed/config.h"

namespace deepspeed {
class Mpu;
}

namespace deepspeed::zero {

namespace detail {

/// One running call of a unit's forward (and later its backward). Defined in the library.
class UnitCall;

/// Called on entry to a unit's forward. Returns nullptr when `module` is not a unit of a live
/// ZeRO-3 engine (the wrapper is then a plain call); otherwise its parameters are gathered.
std::shared_ptr<UnitCall> enter_unit(const torch::nn::Module& module);
/// An alias of a unit input: its gradient arriving means the unit's backward is over.
at::Tensor track_input(const std::shared_ptr<UnitCall>& call, const at::Tensor& input);
/// Called with the unit's output tensors: releases the parameters and arms the backward gather.
void exit_unit(const std::shared_ptr<UnitCall>& call, const std::vector<at::Tensor>& outputs);
/// Called when the unit's forward threw: releases what enter_unit gathered.
void abort_unit(const std::shared_ptr<UnitCall>& call) noexcept;
/// Called by every zero::Unit constructor: partitions it when a zero::Init scope is active.
void on_unit_constructed(torch::nn::Module& module);

template <typename T>
decltype(auto) track(const std::shared_ptr<UnitCall>& call, T&& arg) {
  if constexpr (std::is_same_v<std::decay_t<T>, at::Tensor>) {
    return at::Tensor(track_input(call, arg));
  } else {
    return std::forward<T>(arg);
  }
}

// The tensors of a forward's result (a tensor, or tuples, pairs and vectors of them).
template <typename T>
void collect(std::vector<at::Tensor>& out, const T& value);
template <typename A, typename B>
void collect(std::vector<at::Tensor>& out, const std::pair<A, B>& value);
template <typename... T>
void collect(std::vector<at::Tensor>& out, const std::tuple<T...>& value);
template <typename T>
void collect(std::vector<at::Tensor>& out, const std::vector<T>& value);

template <typename T>
void collect(std::vector<at::Tensor>& out, const T& value) {
  if constexpr (std::is_same_v<T, at::Tensor>) out.push_back(value);
}
template <typename A, typename B>
void collect(std::vector<at::Tensor>& out, const std::pair<A, B>& value) {
  collect(out, value.first);
  collect(out, value.second);
}
template <typename... T>
void collect(std::vector<at::Tensor>& out, const std::tuple<T...>& value) {
  std::apply([&](const auto&... e) { (collect(out, e), ...); }, value);
}
template <typename T>
void collect(std::vector<at::Tensor>& out, const std::vector<T>& value) {
  for (const auto& e : value) collect(out, e);
}

}  // namespace detail

/// Marks a module as a ZeRO-3 unit (see zero::Unit).
class UnitBase {
 public:
  virtual ~UnitBase() = default;
};

/// A module `M` (e.g. a transformer block's Impl class) that is one ZeRO-3 unit: build it as
/// std::make_shared<zero::Unit<M>>(M's constructor arguments...) and register it as usual.
/// It *is* an M (same parameter names, same members), so only the call changes: calling
/// forward() through the Unit type gathers the parameters around M::forward. Without a ZeRO-3
/// engine the wrapper just calls M::forward. Units inside a unit are gathered with it.
/// A Unit cannot be a Sequential child (AnyModule needs a non-template forward); Sequential
/// children are units already.
template <typename M>
class Unit : public M, public UnitBase {
 public:
  template <typename... Args>
  explicit Unit(Args&&... args) : M(std::forward<Args>(args)...) {
    detail::on_unit_constructed(*this);
  }

  template <typename... Args>
  auto forward(Args&&... args) -> decltype(std::declval<M&>().forward(std::forward<Args>(args)...)) {
    auto call = detail::enter_unit(*this);
    if (!call) return M::forward(std::forward<Args>(args)...);
    try {
      auto out = M::forward(detail::track(call, std::forward<Args>(args))...);
      std::vector<at::Tensor> tensors;
      detail::collect(tensors, out);
      detail::exit_unit(call, tensors);
      return out;
    } catch (...) {
      detail::abort_unit(call);
      throw;
    }
  }
};

/// DeepSpeed's deepspeed.zero.GatheredParameters (read-only form): every parameter of `module`
/// that a live ZeRO-3 engine partitions is all-gathered for the lifetime of this object, e.g.
/// to read, evaluate or save the full weights, and released after. Every rank must construct
/// it at the same point (it issues collectives). Changes made to the gathered values are not
/// written back to the shards (DeepSpeed's modifier_rank is not supported).
class GatheredParameters {
 public:
  explicit GatheredParameters(torch::nn::Module& module);
  ~GatheredParameters();
  GatheredParameters(const GatheredParameters&) = delete;
  GatheredParameters& operator=(const GatheredParameters&) = delete;

 private:
  std::vector<std::pair<std::weak_ptr<void>, std::vector<size_t>>> held_;
};

/// Partitioned construction (DeepSpeed's deepspeed.zero.Init). While an Init is alive (one per
/// thread at a time), every zero::Unit partitions its parameters right after its constructor:
/// each parameter is cast to the training dtype (fp16/bf16 from `config`), broadcast from the
/// data-parallel group's first rank (so every replica starts from one initialisation, as in
/// DeepSpeed), and all but this rank's shard of ceil(numel / W) elements is freed, W being the
/// data-parallel size (the world without `mpu`; give the engine the same mpu), or with
/// zero_optimization.mics_shard_size the MiCS shard size (DeepSpeed's MiCS_Init). Parameters
/// of at most stage3_param_persistence_threshold elements stay whole. Modules that are not
/// zero::Unit (e.g. Sequential children) are partitioned by calling partition() on them once
/// built.
/// The engine then adopts the shards: deepspeed::initialize must get the same config (stage 3,
/// same world size). Throws ConfigError unless zero_optimization.stage is 3.
class Init {
 public:
  explicit Init(const DeepSpeedConfig& config, std::shared_ptr<Mpu> mpu = nullptr);
  ~Init();
  Init(const Init&) = delete;
  Init& operator=(const Init&) = delete;

  /// Partitions every parameter of `module` (recursively) that is not partitioned yet.
  void partition(torch::nn::Module& module);
  /// Same, for a module holder or pointer; returns it (e.g. seq->push_back(init.partition(
  /// torch::nn::Linear(4, 4)))).
  template <typename Holder>
  Holder partition(Holder holder) {
    partition(*holder);
    return holder;
  }
  /// Elements this Init has partitioned so far, and the elements of this rank's shards of them.
  int64_t partitioned_numel() const { return partitioned_numel_; }
  int64_t shard_numel() const { return shard_numel_; }

 private:
  at::ScalarType dtype_;
  int64_t persistence_threshold_;
  comm::Group dp_group_;     // broadcast over
  comm::Group shard_group_;  // partitioned over: dp_group_, or MiCS' shard group
  int64_t partitioned_numel_ = 0;
  int64_t shard_numel_ = 0;
  Init* previous_ = nullptr;
};

}  // namespace deepspeed::zero
