// comm::ParallelGroups: the process groups of a ProcessTopology, built once. Every rank creates
// every group of every axis, in the topology's axis order and, within an axis, in the order of
// get_axis_comm_lists (c10d requires the same calls in the same order everywhere), and keeps
// the one group per axis it belongs to. An axis the topology lacks is a group of this rank
// alone. DeepSpeed's counterpart: PipelineParallelGrid (runtime/pipe/topology.py).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "deepspeed/comm.h"
#include "deepspeed/topology.h"

namespace deepspeed::comm {

class ParallelGroups {
 public:
  /// Collective over the world: every rank must construct it from the same topology, whose
  /// world size must equal comm's (UsageError otherwise). Initializes deepspeed::comm from the
  /// environment when needed.
  explicit ParallelGroups(ProcessTopology topology);

  const ProcessTopology& topology() const { return topology_; }
  /// This rank's group along `axis` ("data", "model", "pipe", "expert", or any axis of the
  /// topology); a group of this rank alone, named after the axis, for an axis it lacks.
  const Group& group(const std::string& axis) const;
  const Group& data() const { return group("data"); }
  const Group& model() const { return group("model"); }
  const Group& pipe() const { return group("pipe"); }
  const Group& expert() const { return group("expert"); }
  /// This rank's coordinate on `axis` (its rank in group(axis)); 0 for an axis it lacks.
  int coord(const std::string& axis) const;

 private:
  ProcessTopology topology_;
  std::map<std::string, Group> groups_;  // this rank's group per axis of the topology
  std::map<std::string, Group> absent_;  // groups of one for the well-known axes it lacks
};

}  // namespace deepspeed::comm
