// ParallelGroups: one new_group() per group of every axis, the same calls on every rank.
#include "deepspeed/parallel_groups.h"

#include "util/check.h"

namespace deepspeed::comm {

ParallelGroups::ParallelGroups(ProcessTopology topology) : topology_(std::move(topology)) {
  init_distributed();
  const int rank = get_rank();
  DS_CHECK(topology_.world_size() == get_world_size(), UsageError, "ParallelGroups: the topology ",
           "has ", topology_.world_size(), " ranks but this job has WORLD_SIZE=", get_world_size(),
           "; the product of the axis sizes must equal the world size");
  for (const auto& axis : topology_.get_axis_names()) {
    for (const auto& ranks : topology_.get_axis_comm_lists(axis)) {
      Group g = new_group(ranks, axis);
      if (g.is_member()) groups_.emplace(axis, std::move(g));
    }
    DS_INTERNAL_ASSERT(groups_.count(axis) == 1, "rank ", rank, " is in no '", axis, "' group");
  }
  for (const char* axis : {"data", "model", "pipe", "expert"}) {
    if (!groups_.count(axis)) absent_.emplace(axis, self_group(axis));
  }
}

const Group& ParallelGroups::group(const std::string& axis) const {
  auto it = groups_.find(axis);
  if (it != groups_.end()) return it->second;
  auto absent = absent_.find(axis);
  DS_CHECK(absent != absent_.end(), UsageError, "ParallelGroups: no axis '", axis,
           "' (the topology has ", topology_.get_axis_names().size(), " axes)");
  return absent->second;
}

int ParallelGroups::coord(const std::string& axis) const {
  return topology_.has_axis(axis) ? topology_.get_coord(get_rank(), axis) : 0;
}

}  // namespace deepspeed::comm
