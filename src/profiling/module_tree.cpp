// Module tree construction and ancestor queries.
#include "profiling/module_tree.h"

#include <unordered_set>

namespace deepspeed::profiling::detail {

std::string short_type_name(const std::string& demangled) {
  std::string s = demangled;
  const size_t colon = s.rfind("::");
  if (colon != std::string::npos) s = s.substr(colon + 2);
  constexpr const char* kImpl = "Impl";
  if (s.size() > 4 && s.compare(s.size() - 4, 4, kImpl) == 0) s.resize(s.size() - 4);
  return s;
}

ModuleTree::ModuleTree(const std::shared_ptr<torch::nn::Module>& root) {
  std::unordered_map<std::string, int> by_name;
  for (const auto& item : root->named_modules(/*name_prefix=*/"", /*include_self=*/true)) {
    ModuleNode n;
    n.name = item.key();
    n.module = item.value();
    n.type = short_type_name(n.module->name());
    n.forward_uses_weight_view = n.module->name() == "torch::nn::LinearImpl";
    if (!n.name.empty()) {
      // named_modules() is pre-order, so the parent ("h.0" of "h.0.attn") is already known.
      const size_t dot = n.name.rfind('.');
      auto parent = by_name.find(dot == std::string::npos ? std::string() : n.name.substr(0, dot));
      n.parent = parent == by_name.end() ? 0 : parent->second;
      n.depth = nodes_[n.parent].depth + 1;
    }
    const int index = static_cast<int>(nodes_.size());
    if (n.parent >= 0) nodes_[n.parent].children.push_back(index);
    by_name.emplace(n.name, index);
    index_.emplace(n.module.get(), index);  // a module registered twice keeps its first place
    nodes_.push_back(std::move(n));
  }
  for (int i = 0; i < static_cast<int>(nodes_.size()); ++i) {
    auto& n = nodes_[i];
    std::unordered_set<const c10::TensorImpl*> seen;
    for (const auto& p : n.module->parameters(/*recurse=*/true)) {
      if (p.requires_grad() && seen.insert(p.unsafeGetTensorImpl()).second) n.params += p.numel();
    }
    for (const auto& p : n.module->parameters(/*recurse=*/false)) {
      owners_[p.unsafeGetTensorImpl()].push_back(i);
    }
    for (const auto& b : n.module->buffers(/*recurse=*/false)) {
      owners_[b.unsafeGetTensorImpl()].push_back(i);
    }
  }
}

int ModuleTree::lca(int a, int b) const {
  while (nodes_[a].depth > nodes_[b].depth) a = nodes_[a].parent;
  while (nodes_[b].depth > nodes_[a].depth) b = nodes_[b].parent;
  while (a != b) {
    a = nodes_[a].parent;
    b = nodes_[b].parent;
  }
  return a;
}

bool ModuleTree::within(int node, int ancestor) const {
  while (node >= 0 && nodes_[node].depth > nodes_[ancestor].depth) node = nodes_[node].parent;
  return node == ancestor;
}

const std::vector<int>* ModuleTree::owners_of(const c10::TensorImpl* tensor) const {
  auto it = owners_.find(tensor);
  return it == owners_.end() ? nullptr : &it->second;
}

int ModuleTree::index_of(const torch::nn::Module* module) const {
  auto it = index_.find(module);
  return it == index_.end() ? -1 : it->second;
}

}  // namespace deepspeed::profiling::detail
