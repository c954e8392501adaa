// What a stage asks of all its gradient reducers at once (stage 0's GradReducers, stages 1/2's
// PartitionedGradReducers: one for the dense parameters and one per MoE expert group).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace deepspeed::runtime {

template <typename Reducer>
int64_t total_buckets(const std::vector<std::unique_ptr<Reducer>>& reducers) {
  int64_t n = 0;
  for (const auto& r : reducers) n += static_cast<int64_t>(r->num_buckets());
  return n;
}

/// True while any reducer has hooks armed for a backward that has not finished.
template <typename Reducer>
bool any_armed(const std::vector<std::unique_ptr<Reducer>>& reducers) {
  for (const auto& r : reducers) {
    if (r->armed()) return true;
  }
  return false;
}

}  // namespace deepspeed::runtime
