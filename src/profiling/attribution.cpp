// Op attribution (see Note [Op attribution] in attribution.h).
#include "profiling/attribution.h"

namespace deepspeed::profiling::detail {

std::vector<int> attribute_events(const ModuleTree& tree, const std::vector<OpEvent>& events) {
  std::vector<int> module_of(events.size(), 0);
  auto within_scope = [&](int node, int scope) {
    return scope < 0 || tree.within(node, scope) ? node : scope;
  };
  int previous = 0;  // the profile starts in the root's forward
  std::vector<size_t> pending;
  auto resolve_pending = [&](int next) {
    const int common = tree.lca(previous, next);
    for (size_t i : pending) module_of[i] = within_scope(common, events[i].scope);
    pending.clear();
  };
  for (size_t i = 0; i < events.size(); ++i) {
    const OpEvent& e = events[i];
    if (e.owners.empty()) {
      pending.push_back(i);
      continue;
    }
    int owner = e.owners.front();
    int closest_depth = -1;
    for (int candidate : e.owners) {
      const int depth = tree.nodes()[tree.lca(candidate, previous)].depth;
      if (depth > closest_depth) {
        closest_depth = depth;
        owner = candidate;
      }
    }
    owner = within_scope(owner, e.scope);
    resolve_pending(owner);
    module_of[i] = owner;
    previous = owner;
  }
  resolve_pending(0);
  return module_of;
}

}  // namespace deepspeed::profiling::detail
