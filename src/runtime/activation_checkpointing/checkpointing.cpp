// deepspeed::checkpointing: the settings (configure), the counters, and the autograd node that
// runs a function without a graph in forward and again in backward. What is kept of the inputs
// is SavedInputs' business; the generator states RngState's.
#include "deepspeed/checkpointing.h"

#include <torch/csrc/autograd/custom_function.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <memory>
#include <mutex>

#include "deepspeed/autocast.h"
#include "deepspeed/config.h"
#include "deepspeed/mpu.h"
#include "runtime/activation_checkpointing/rng_state.h"
#include "runtime/activation_checkpointing/saved_inputs.h"
#include "runtime/timers.h"
#include "util/check.h"
#include "util/logging.h"

namespace deepspeed::checkpointing {
namespace detail {
namespace {

struct Settings {
  std::mutex mutex;
  Options options;
  ModelParallel mp;
  bool configured = false;
  Stats stats;
  runtime::Timers timers;  // "fwd" / "backward" under profile
};

Settings& settings() {
  static Settings s;
  return s;
}

// Matches DeepSpeed's synchronize_checkpoint_boundary: a device synchronize (its CPU accelerator's
// is a no-op; nothing is asynchronous on the CPU).
void synchronize_boundary() {
  if (torch::cuda::is_available()) torch::cuda::synchronize();
  count(&Stats::synchronizations);
}

void profile(const std::string& timer, bool start) {
  auto& s = settings();
  std::string line;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    if (start) {
      s.timers.start(timer);
      return;
    }
    s.timers.stop(timer);
    line = s.timers.log({timer});
  }
  log::info_rank0(line);
}

// One checkpointed call: everything its backward needs, held by the autograd node.
struct Call : torch::CustomClassHolder {
  Function function;
  Options options;
  RngState rng;
  // The forward's autocast state: backward runs outside autocast, so the recomputation
  // re-enters it (as torch.utils.checkpoint does), or it would recompute in fp32.
  bool cpu_autocast = false;
  c10::ScalarType cpu_autocast_dtype = c10::kBFloat16;
  bool cuda_autocast = false;
  c10::ScalarType cuda_autocast_dtype = c10::kHalf;
  std::unique_ptr<SavedInputs> saved;
  size_t num_inputs = 0;  // the caller's inputs
  bool anchored = false;  // a trailing extra input, the grad anchor, follows them
};

class CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                c10::intrusive_ptr<Call> call,
                                                at::TensorList inputs) {
    const std::vector<at::Tensor> args(inputs.begin(), inputs.begin() + call->num_inputs);
    call->rng = RngState::capture();
    call->cpu_autocast = autocast_enabled(c10::DeviceType::CPU);
    call->cpu_autocast_dtype = autocast_dtype(c10::DeviceType::CPU);
    call->cuda_autocast = autocast_enabled(c10::DeviceType::CUDA);
    call->cuda_autocast_dtype = autocast_dtype(c10::DeviceType::CUDA);
    std::vector<at::Tensor> outputs = call->function(args);  // apply() disabled grad mode
    std::vector<at::Tensor> non_differentiable;
    for (const auto& out : outputs) {
      DS_CHECK(out.defined(), UsageError,
               "checkpointing::checkpoint: the checkpointed function returned an undefined "
               "tensor; return only defined tensors");
      if (!out.is_floating_point()) non_differentiable.push_back(out);
    }
    ctx->mark_non_differentiable(non_differentiable);
    ctx->saved_data["call"] = c10::IValue::make_capsule(call);
    return outputs;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto call = c10::static_intrusive_pointer_cast<Call>(ctx->saved_data.at("call").toCapsule());
    const Options& o = call->options;
    DS_CHECK(call->saved != nullptr, UsageError,
             "checkpointing::checkpoint: backward ran twice through one checkpointed call; its "
             "inputs are released after the first backward (retain_graph is not supported)");
    if (o.synchronize_checkpoint_boundary) synchronize_boundary();
    if (o.profile) profile("backward", true);
    // Matches DeepSpeed: the first backward ends the forward's use of the contiguous buffers.
    if (o.contiguous_memory_optimization) clear_contiguous_buffers();

    std::vector<at::Tensor> inputs = call->saved->restore();
    std::vector<at::Tensor> outputs;
    {
      RngStateSwap rng(call->rng);
      torch::AutoGradMode grad_mode(true);
      AutocastScope cpu(c10::DeviceType::CPU, call->cpu_autocast_dtype, call->cpu_autocast);
      AutocastScope cuda(c10::DeviceType::CUDA, call->cuda_autocast_dtype, call->cuda_autocast);
      outputs = call->function(inputs);
    }
    DS_CHECK(outputs.size() == grads.size(), UsageError,
             "checkpointing::checkpoint: the recomputation returned ", outputs.size(),
             " tensors, the forward ", grads.size(),
             "; the checkpointed function must return "
             "the same outputs each time it runs");
    std::vector<at::Tensor> roots, root_grads;
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (outputs[i].requires_grad() && grads[i].defined()) {
        roots.push_back(outputs[i]);
        root_grads.push_back(grads[i]);
      }
    }
    if (!roots.empty()) torch::autograd::backward(roots, root_grads);
    count(&Stats::recomputes);

    torch::autograd::variable_list result;
    result.reserve(1 + inputs.size() + 1);
    result.emplace_back();  // the Call argument
    for (const auto& x : inputs) result.push_back(x.defined() ? x.grad() : at::Tensor());
    if (call->anchored) result.emplace_back();
    // Matches DeepSpeed: drop the kept inputs now rather than with the graph.
    call->saved.reset();
    if (o.profile) profile("backward", false);
    if (o.synchronize_checkpoint_boundary) synchronize_boundary();
    return result;
  }
};

}  // namespace

void account_saved_bytes(int64_t delta) {
  auto& s = settings();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.stats.saved_bytes += delta;
  s.stats.peak_saved_bytes = std::max(s.stats.peak_saved_bytes, s.stats.saved_bytes);
}

void count(int64_t Stats::*counter, int64_t n) {
  auto& s = settings();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.stats.*counter += n;
}

}  // namespace detail

void configure(const Mpu* mpu, const DeepSpeedConfig* config, const ConfigureOverrides& overrides) {
  Options o;  // DeepSpeed's _configure_defaults()
  if (config != nullptr) {
    const auto& a = config->activation_checkpointing;
    o.partition_activations = a.partition_activations;
    o.cpu_checkpointing = a.cpu_checkpointing;
    o.contiguous_memory_optimization = a.contiguous_memory_optimization;
    o.number_checkpoints = a.number_checkpoints;
    o.synchronize_checkpoint_boundary = a.synchronize_checkpoint_boundary;
    o.profile = a.profile;
  }
  if (overrides.partition_activations) o.partition_activations = *overrides.partition_activations;
  if (overrides.contiguous_checkpointing) {
    o.contiguous_memory_optimization = *overrides.contiguous_checkpointing;
  }
  if (overrides.num_checkpoints) o.number_checkpoints = *overrides.num_checkpoints;
  if (overrides.checkpoint_in_cpu) o.cpu_checkpointing = *overrides.checkpoint_in_cpu;
  if (overrides.synchronize) o.synchronize_checkpoint_boundary = *overrides.synchronize;
  if (overrides.profile) o.profile = *overrides.profile;
  DS_CHECK(!o.contiguous_memory_optimization || o.partition_activations, ConfigError,
           "activation_checkpointing.contiguous_memory_optimization needs partition_activations "
           "(the buffers hold partitions); set partition_activations to true or turn it off");
  DS_CHECK(!o.contiguous_memory_optimization || (o.number_checkpoints && *o.number_checkpoints > 0),
           ConfigError,
           "activation_checkpointing.contiguous_memory_optimization needs number_checkpoints (the "
           "number of checkpointed calls per forward, the buffers' slot count)");

  auto& s = detail::settings();
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    s.options = o;
    s.configured = true;
    if (mpu != nullptr) {
      detail::ModelParallel mp;
      mp.group = mpu->get_model_parallel_group();
      mp.rank = mpu->get_model_parallel_rank();
      mp.size = mpu->get_model_parallel_world_size();
      s.mp = mp;
    }
  }
  detail::clear_contiguous_buffers();
  log::info_rank0("activation checkpointing: partition_activations " +
                  std::string(o.partition_activations ? "true" : "false") +
                  " (model-parallel size " + std::to_string(s.mp.size) + "), cpu_checkpointing " +
                  (o.cpu_checkpointing ? "true" : "false") + ", contiguous_memory_optimization " +
                  (o.contiguous_memory_optimization ? "true" : "false") + " with " +
                  (o.number_checkpoints ? std::to_string(*o.number_checkpoints) : "None") +
                  " checkpoints, synchronize_checkpoint_boundary " +
                  (o.synchronize_checkpoint_boundary ? "true" : "false") + ", profile " +
                  (o.profile ? "true" : "false"));
}

bool is_configured() {
  auto& s = detail::settings();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.configured;
}

Options options() {
  auto& s = detail::settings();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.options;
}

void reset() { detail::clear_contiguous_buffers(); }

std::vector<at::Tensor> checkpoint(const Function& function,
                                   const std::vector<at::Tensor>& inputs) {
  DS_CHECK(static_cast<bool>(function), UsageError,
           "checkpointing::checkpoint: the function is empty");
  // Without grad mode nothing will be recomputed: run it plainly and keep nothing.
  if (!torch::GradMode::is_enabled()) return function(inputs);

  auto& s = detail::settings();
  auto call = c10::make_intrusive<detail::Call>();
  detail::ModelParallel mp;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    call->options = s.options;
    mp = s.mp;
  }
  call->function = function;
  call->num_inputs = inputs.size();
  const Options& o = call->options;
  if (o.synchronize_checkpoint_boundary) detail::synchronize_boundary();
  if (o.profile) detail::profile("fwd", true);

  std::vector<at::Tensor> args = inputs;
  bool any_requires_grad = false;
  for (const auto& x : inputs) any_requires_grad |= x.defined() && x.requires_grad();
  // The node only joins the graph when an input requires grad; a parameter-only block (inputs
  // straight from data) still needs its backward, so an anchor leaf stands in.
  at::Tensor anchor;
  if (!any_requires_grad) {
    anchor = at::empty({0}).set_requires_grad(true);
    args.push_back(anchor);
    call->anchored = true;
  }
  call->saved = std::make_unique<detail::SavedInputs>(inputs, o, mp);
  std::vector<at::Tensor> outputs = detail::CheckpointFunction::apply(call, at::TensorList(args));
  detail::count(&Stats::forwards);
  if (o.profile) detail::profile("fwd", false);
  if (o.synchronize_checkpoint_boundary) detail::synchronize_boundary();
  return outputs;
}

at::Tensor checkpoint(const std::function<at::Tensor(const at::Tensor&)>& function,
                      const at::Tensor& input) {
  DS_CHECK(static_cast<bool>(function), UsageError,
           "checkpointing::checkpoint: the function is empty");
  auto outputs = checkpoint(
      [function](const std::vector<at::Tensor>& xs) {
        return std::vector<at::Tensor>{function(xs[0])};
      },
      std::vector<at::Tensor>{input});
  return outputs[0];
}

Stats stats() {
  auto& s = detail::settings();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.stats;
}

void reset_stats() {
  auto& s = detail::settings();
  std::lock_guard<std::mutex> lock(s.mutex);
  const int64_t held = s.stats.saved_bytes;
  s.stats = Stats{};
  s.stats.saved_bytes = held;  // still held: released calls subtract it
  s.stats.peak_saved_bytes = held;
}

}  // namespace deepspeed::checkpointing
