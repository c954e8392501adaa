// The profiled model's module tree, flattened in named_modules() order (pre-order), with what
// attribution needs: parents and depths for lowest common ancestors, which module registers
// each parameter / buffer tensor, and each module's trainable parameter count.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <torch/nn/module.h>

namespace deepspeed::profiling::detail {

struct ModuleNode {
  std::string name;  // path as named_modules() gives it: "" for the root, "h.0.attn"
  std::string type;  // class name without namespace and "Impl": "Linear", "Gpt"
  int parent = -1;
  int depth = 0;
  std::vector<int> children;
  int64_t params = 0;  // trainable parameters of the module and its children, each counted once
  // torch::nn::Linear: its C++ forward is t(weight) then addmm / matmul (+ add_), so an operator
  // reading the t() view belongs to it (op_recorder.cpp).
  bool forward_uses_weight_view = false;
  std::shared_ptr<torch::nn::Module> module;
};

class ModuleTree {
 public:
  /// Walks `root`'s named_modules(); index 0 is the root.
  explicit ModuleTree(const std::shared_ptr<torch::nn::Module>& root);

  const std::vector<ModuleNode>& nodes() const { return nodes_; }
  /// Deepest module containing both.
  int lca(int a, int b) const;
  /// True when `node` is `ancestor` or below it.
  bool within(int node, int ancestor) const;
  /// Modules that register the tensor directly (parameter or buffer); nullptr when none.
  const std::vector<int>* owners_of(const c10::TensorImpl* tensor) const;
  /// The node of `module`, or -1 when it is not part of this tree.
  int index_of(const torch::nn::Module* module) const;

 private:
  std::vector<ModuleNode> nodes_;
  std::unordered_map<const c10::TensorImpl*, std::vector<int>> owners_;
  std::unordered_map<const torch::nn::Module*, int> index_;
};

/// "torch::nn::LinearImpl" -> "Linear".
std::string short_type_name(const std::string& demangled);

}  // namespace deepspeed::profiling::detail
