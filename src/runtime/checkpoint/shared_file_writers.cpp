// Note [Node-local checkpoint storage] (shared_file_writers.h).
#include "runtime/checkpoint/shared_file_writers.h"

#include <algorithm>

#include "deepspeed/pipe.h"

namespace deepspeed::checkpoint {

std::vector<int> shared_file_writers(const comm::Group& replicas, bool node_local) {
  if (!node_local) return replicas.ranks();
  const int first = comm::get_rank() - comm::get_local_rank();
  const int end = first + comm::get_local_world_size();
  std::vector<int> on_node;
  for (int r : replicas.ranks()) {
    if (r >= first && r < end) on_node.push_back(r);
  }
  return on_node;
}

bool writes_shared_files(const comm::Group& replicas, bool node_local) {
  const std::vector<int> writers = shared_file_writers(replicas, node_local);
  return !writers.empty() && writers.front() == comm::get_rank();
}

std::pair<int, int> shared_files_to_write(int count, const std::vector<int>& writers, int rank,
                                          bool split) {
  const auto me = std::find(writers.begin(), writers.end(), rank);
  if (me == writers.end()) return {count, count};
  if (!split) {
    return me == writers.begin() ? std::make_pair(0, count) : std::make_pair(count, count);
  }
  const auto i = static_cast<size_t>(me - writers.begin());
  const std::vector<int> parts = pipe::partition_uniform(count, static_cast<int>(writers.size()));
  return {parts[i], parts[i + 1]};
}

}  // namespace deepspeed::checkpoint
