// The flops profiler: DeepSpeed's `flops_profiler` (deepspeed/profiling/flops_profiler/) for C++
// torch::nn::Module trees. C++ modules have no forward hooks, so the profiler records the ATen
// operators the model calls (LibTorch's RecordFunction callbacks, with input and output shapes),
// costs each with DeepSpeed's formulas, and attributes it to a module: to the module owning a
// parameter the operator reads (a Linear's weight), else to the deepest module certainly
// containing it, or to the module named by an enclosing ModuleScope. See Note [Op attribution]
// in docs/observability.md for what is exact and what is a lower bound.
//
// Engine use (DeepSpeed's): at global step `profile_step`, on rank 0, start_profile() before each
// forward and stop_profile() after it; after the optimizer step print_model_profile() and
// end_profile(). Forward FLOPs are counted; backward is estimated as 2x forward (+ recompute).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/nn/module.h>

#include "deepspeed/config.h"

namespace deepspeed::profiling {

namespace detail {
class ModuleTree;
class OpRecorder;
}  // namespace detail

/// What the engine knows and the profiler does not (DeepSpeed reads these from its engine).
/// Unset latencies leave their lines out of the summary, as DeepSpeed does without
/// wall_clock_breakdown.
struct ProfileContext {
  int64_t world_size = 1;
  int64_t dp_world_size = 1;
  int64_t mp_world_size = 1;
  int64_t train_micro_batch_size_per_gpu = 0;  // 0: not printed
  std::optional<double> fwd_latency_s;   // the engine's `fwd` timer; unset: the profiler's own
  std::optional<double> bwd_latency_s;   // the engine's `bwd` timer
  std::optional<double> step_latency_s;  // the engine's `step` timer
};

/// One module's profile; totals include the module's children.
struct ModuleProfile {
  std::string name;  // path as named_modules() gives it ("" for the root, "h.0.attn")
  std::string type;  // "Linear"
  int depth = 0;
  int64_t params = 0;  // trainable parameters
  int64_t macs = 0;
  int64_t flops = 0;
  double latency_s = 0.0;  // root: wall time of the profiled forwards; others: their operators'
};

/// Totals per ATen operator ("aten::linear").
struct OpProfile {
  int64_t calls = 0;
  int64_t macs = 0;
  int64_t flops = 0;
  double latency_s = 0.0;
};

class FlopsProfiler {
 public:
  /// `model` must stay alive while profiling; `config` supplies the defaults of
  /// print_model_profile() (module_depth, top_modules, detailed, output_file,
  /// recompute_fwd_factor).
  explicit FlopsProfiler(std::shared_ptr<torch::nn::Module> model, FlopsProfilerConfig config = {});
  ~FlopsProfiler();
  FlopsProfiler(const FlopsProfiler&) = delete;
  FlopsProfiler& operator=(const FlopsProfiler&) = delete;

  /// Clears earlier counts, snapshots the module tree and starts recording the operators called
  /// on this thread. Throws UsageError when a profile already records on this thread.
  void start_profile();
  /// Stops recording and keeps the counts. Must run on the thread that started the profile.
  void stop_profile();
  /// Clears the counts (recording, if started, continues).
  void reset_profile();
  /// stop_profile() and forget everything.
  void end_profile();
  bool started() const;

  int64_t get_total_flops() const;
  int64_t get_total_macs() const;
  int64_t get_total_params() const;
  /// Seconds spent in the profiled region(s) (DeepSpeed: the model's forward duration).
  double get_total_duration() const;

  /// Every module, pre-order (the root first).
  std::vector<ModuleProfile> module_profiles() const;
  /// The profile of the module at `name` (named_modules() path); throws UsageError if absent.
  ModuleProfile module_profile(const std::string& name) const;
  std::map<std::string, OpProfile> op_profiles() const;

  /// DeepSpeed's report: summary (at `profile_step`), aggregated profile per depth (top
  /// `top_modules` module types by params, MACs, latency; `module_depth` -1 = all depths) and,
  /// when `detailed`, the module tree annotated with each module's share.
  std::string model_profile_string(int64_t profile_step, const ProfileContext& context,
                                   int64_t module_depth, int64_t top_modules, bool detailed) const;
  /// Prints that report with the config's module_depth, top_modules and detailed to stdout, or
  /// writes it to the config's output_file (truncating). Throws Error when the file cannot be
  /// written.
  void print_model_profile(int64_t profile_step, const ProfileContext& context) const;

 private:
  std::shared_ptr<torch::nn::Module> model_;
  FlopsProfilerConfig config_;
  std::unique_ptr<detail::ModuleTree> tree_;
  std::unique_ptr<detail::OpRecorder> recorder_;
};

/// Names the module whose code runs in this scope, for exact attribution: every operator called
/// until the scope closes is attributed to `module` (or to a module below it owning the
/// operator's parameter). Costs one thread-local read when nothing is profiled. Put it at the
/// top of a module's forward:  `deepspeed::profiling::ModuleScope scope(*this);`
class ModuleScope {
 public:
  explicit ModuleScope(const torch::nn::Module& module);
  ~ModuleScope();
  ModuleScope(const ModuleScope&) = delete;
  ModuleScope& operator=(const ModuleScope&) = delete;

 private:
  bool pushed_;
};

struct ModelProfileOptions {
  bool print_profile = true;
  bool detailed = true;
  int64_t module_depth = -1;
  int64_t top_modules = 1;
  int64_t warm_up = 1;      // forwards run before the profiled one
  std::string output_file;  // "" = stdout
};

struct ModelProfile {
  int64_t flops = 0;
  int64_t macs = 0;
  int64_t params = 0;
  std::string report;  // the printed report
};

/// DeepSpeed's get_model_profile(): puts `model` in eval mode, runs `forward` warm_up times,
/// then once under the profiler, and returns (and by default prints) the profile.
ModelProfile get_model_profile(const std::shared_ptr<torch::nn::Module>& model,
                               const std::function<void()>& forward,
                               const ModelProfileOptions& options = {});

}  // namespace deepspeed::profiling
