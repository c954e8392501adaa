// Megatron's CudaRNGStatesTracker and model_parallel_cuda_manual_seed, on the CPU generator.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <torch/torch.h>

#include <algorithm>
#include <mutex>

#include "deepspeed/tensor_parallel.h"
#include "util/check.h"

namespace deepspeed::tensor_parallel {
namespace {

at::Tensor default_state() {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_default_state(const at::Tensor& state) {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

}  // namespace

void RngStatesTracker::reset() {
  states_.clear();
  seeds_.clear();
}

void RngStatesTracker::add(const std::string& name, uint64_t seed) {
  DS_CHECK(std::find(seeds_.begin(), seeds_.end(), seed) == seeds_.end(), UsageError,
           "RngStatesTracker::add: seed ", seed, " already exists");
  DS_CHECK(!states_.count(name), UsageError, "RngStatesTracker::add: state '", name,
           "' already exists");
  seeds_.push_back(seed);
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  states_[name] = gen.get_state();
}

std::map<std::string, at::Tensor> RngStatesTracker::get_states() const {
  std::map<std::string, at::Tensor> out;
  for (const auto& [name, state] : states_) out[name] = state.clone();
  return out;
}

void RngStatesTracker::set_states(std::map<std::string, at::Tensor> states) {
  states_ = std::move(states);
}

RngStatesTracker::Fork::Fork(RngStatesTracker* tracker, std::string name)
    : tracker_(tracker), name_(std::move(name)) {
  auto it = tracker_->states_.find(name_);
  DS_CHECK(it != tracker_->states_.end(), UsageError, "RngStatesTracker::fork: state '", name_,
           "' is not added (call model_parallel_manual_seed first)");
  saved_default_ = default_state();
  set_default_state(it->second);
}

RngStatesTracker::Fork::~Fork() {
  tracker_->states_[name_] = default_state();
  set_default_state(saved_default_);
}

RngStatesTracker& get_rng_tracker() {
  static RngStatesTracker tracker;
  return tracker;
}

void model_parallel_manual_seed(uint64_t seed, const comm::Group& tp_group) {
  // Matches Megatron: 2718 keeps the model-parallel streams away from the data-parallel one.
  const uint64_t tensor_parallel_seed = seed + 2718 + static_cast<uint64_t>(tp_group.rank());
  torch::manual_seed(seed);
  get_rng_tracker().reset();
  get_rng_tracker().add(RngStatesTracker::kModelParallelRngName, tensor_parallel_seed);
}

}  // namespace deepspeed::tensor_parallel
