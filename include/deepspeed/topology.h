// ProcessTopology: DeepSpeed's mapping between a rank and its coordinate on named parallelism
// axes (runtime/pipe/topology.py). Ranks are laid out row-major over the axes in the order
// given, the last axis varying fastest: in PipeModelDataParallelTopology (axes pipe, data,
// model) the ranks of one tensor-parallel group are adjacent, as Megatron places them.
// Pure arithmetic, no communication: comm::ParallelGroups builds the process groups from it.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace deepspeed {

class ProcessTopology {
 public:
  /// `axes` and `dims` pair up: axis i has dims[i] >= 1 coordinates. Axis names are unique.
  ProcessTopology(std::vector<std::string> axes, std::vector<int> dims);

  int world_size() const { return world_size_; }
  const std::vector<std::string>& get_axis_names() const { return axes_; }
  /// The size of `axis`; 1 for an axis this topology does not have (as DeepSpeed's get_dim).
  int get_dim(const std::string& axis) const;
  bool has_axis(const std::string& axis) const;

  /// The rank at a full coordinate ({{"pipe", 1}, {"data", 0}, {"model", 1}}).
  int get_rank(const std::map<std::string, int>& coord) const;
  /// The coordinate of `rank`, one entry per axis.
  std::map<std::string, int> get_coord(int rank) const;
  int get_coord(int rank, const std::string& axis) const;

  /// DeepSpeed's checkpoint-name fragment for `rank`: the axes not omitted as
  /// "<axis><inner_sep><coord as %02d>", joined by outer_sep ("model_01" for the defaults).
  std::string get_rank_repr(int rank,
                            const std::vector<std::string>& omit_axes = {"data", "pipe"},
                            const std::string& inner_sep = "_",
                            const std::string& outer_sep = "-") const;

  /// The groups along `axis`: one list per coordinate of the other axes (in row-major order of
  /// those), each listing the ranks that differ only in `axis`, in `axis` order. Empty for an
  /// unknown axis (as DeepSpeed).
  std::vector<std::vector<int>> get_axis_comm_lists(const std::string& axis) const;
  /// Every rank whose coordinate matches all of `filter` (a partial coordinate), ascending.
  std::vector<int> filter_match(const std::map<std::string, int>& filter) const;
  /// The ranks whose coordinate on `axis` is `idx`, ascending.
  std::vector<int> get_axis_list(const std::string& axis, int idx) const;

 private:
  int axis_index(const std::string& axis) const;

  std::vector<std::string> axes_;
  std::vector<int> dims_;
  std::vector<int> strides_;  // row-major: stride of the last axis is 1
  int world_size_ = 1;
};

/// DeepSpeed's PipeDataParallelTopology: axes pipe, data.
ProcessTopology PipeDataParallelTopology(int num_pp, int num_dp);
/// DeepSpeed's PipeModelDataParallelTopology: axes pipe, data, model.
ProcessTopology PipeModelDataParallelTopology(int num_pp, int num_mp, int num_dp);

}  // namespace deepspeed
