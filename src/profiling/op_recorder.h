// Records the ATen operators that model code calls on this thread, through LibTorch's
// RecordFunction callbacks (at::addThreadLocalCallback with inputs and outputs): each call's
// cost (op_flops.h), its duration, the modules owning its parameter inputs, and the innermost
// ModuleScope open at the time.
//
// Only top-level calls are costed: the operators that an operator calls internally (linear ->
// addmm, cross_entropy -> log_softmax) are its implementation, as DeepSpeed counts only the
// patched Python-level functions and never what they call. einsum is the exception
// (op_flops.h: is_transparent_op).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <ATen/record_function.h>

#include "profiling/module_tree.h"
#include "profiling/op_flops.h"

namespace deepspeed::profiling::detail {

struct OpEvent {
  std::string op;  // "aten::linear"
  OpCost cost;
  double duration_s = 0.0;  // top-level calls only (0 inside einsum)
  std::vector<int> owners;  // modules owning a parameter/buffer input (costed ops only)
  int scope = -1;           // innermost ModuleScope's node, -1 outside any
};

class OpRecorder {
 public:
  explicit OpRecorder(const ModuleTree& tree) : tree_(tree) {}
  ~OpRecorder();

  /// Starts recording this thread's operators (appending to events()). Throws UsageError when
  /// another recorder is active on this thread.
  void start();
  /// Stops recording; must run on the thread that called start() (thread-local callbacks).
  void stop();
  bool active() const { return handle_ != 0; }
  void clear();

  const std::vector<OpEvent>& events() const { return events_; }
  /// Wall time spent between start() and stop(), summed over recordings.
  double wall_s() const { return wall_s_; }

  /// ModuleScope's entry points. push_scope returns false (and records nothing) when no
  /// recorder is active on this thread; pop only what was pushed.
  static bool push_scope(const torch::nn::Module& module);
  static void pop_scope();

 private:
  struct Frame {
    bool costed = false;       // a call whose cost counts (top level, or inside einsum)
    bool transparent = false;  // einsum: its own callees are costed
    std::string op;
    std::vector<c10::IValue> inputs;  // kept until the end callback, which costs the call
    std::chrono::steady_clock::time_point start;
    std::vector<int> owners;
    int scope = -1;
  };

  static std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn);
  static void on_end(const at::RecordFunction& fn, at::ObserverContext* ctx);

  const ModuleTree& tree_;
  at::CallbackHandle handle_ = 0;
  std::chrono::steady_clock::time_point started_;
  double wall_s_ = 0.0;
  std::vector<Frame> stack_;
  std::vector<int> scopes_;
  std::vector<OpEvent> events_;
  // The outputs of the previous top-level call when it was a view of a Linear's weight, and
  // that Linear (see ModuleNode::forward_uses_weight_view). Held so that their addresses
  // cannot be reused by other tensors while compared.
  std::vector<c10::IValue> weight_view_outputs_;
  std::vector<int> weight_view_owners_;
};

}  // namespace deepspeed::profiling::detail
