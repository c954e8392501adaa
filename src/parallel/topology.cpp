// ProcessTopology: row-major rank <-> coordinate arithmetic (see deepspeed/topology.h).
#include "deepspeed/topology.h"

#include <cstdio>
#include <set>

#include "deepspeed/errors.h"
#include "util/check.h"

namespace deepspeed {

ProcessTopology::ProcessTopology(std::vector<std::string> axes, std::vector<int> dims)
    : axes_(std::move(axes)), dims_(std::move(dims)) {
  DS_CHECK(axes_.size() == dims_.size(), UsageError, "ProcessTopology: ", axes_.size(),
           " axis names but ", dims_.size(), " sizes; give one size per axis");
  DS_CHECK(!axes_.empty(), UsageError, "ProcessTopology: give at least one axis");
  std::set<std::string> seen;
  for (size_t i = 0; i < axes_.size(); ++i) {
    DS_CHECK(seen.insert(axes_[i]).second, UsageError, "ProcessTopology: axis '", axes_[i],
             "' is named twice");
    DS_CHECK(dims_[i] >= 1, UsageError, "ProcessTopology: axis '", axes_[i], "' has size ",
             dims_[i], "; sizes must be >= 1");
  }
  strides_.assign(axes_.size(), 1);
  for (size_t i = axes_.size(); i-- > 1;) strides_[i - 1] = strides_[i] * dims_[i];
  world_size_ = strides_[0] * dims_[0];
}

int ProcessTopology::axis_index(const std::string& axis) const {
  for (size_t i = 0; i < axes_.size(); ++i) {
    if (axes_[i] == axis) return static_cast<int>(i);
  }
  return -1;
}

bool ProcessTopology::has_axis(const std::string& axis) const { return axis_index(axis) >= 0; }

int ProcessTopology::get_dim(const std::string& axis) const {
  const int i = axis_index(axis);
  return i < 0 ? 1 : dims_[static_cast<size_t>(i)];
}

int ProcessTopology::get_rank(const std::map<std::string, int>& coord) const {
  DS_CHECK(coord.size() == axes_.size(), UsageError, "ProcessTopology::get_rank: the coordinate has ",
           coord.size(), " axes; this topology has ", axes_.size(), " and all must be given");
  int rank = 0;
  for (size_t i = 0; i < axes_.size(); ++i) {
    auto it = coord.find(axes_[i]);
    DS_CHECK(it != coord.end(), UsageError, "ProcessTopology::get_rank: axis '", axes_[i],
             "' is missing from the coordinate");
    DS_CHECK(it->second >= 0 && it->second < dims_[i], UsageError,
             "ProcessTopology::get_rank: ", axes_[i], "=", it->second, " is outside [0, ",
             dims_[i], ")");
    rank += it->second * strides_[i];
  }
  return rank;
}

std::map<std::string, int> ProcessTopology::get_coord(int rank) const {
  DS_CHECK(rank >= 0 && rank < world_size_, UsageError, "ProcessTopology: rank ", rank,
           " is outside [0, ", world_size_, ")");
  std::map<std::string, int> coord;
  for (size_t i = 0; i < axes_.size(); ++i) coord[axes_[i]] = rank / strides_[i] % dims_[i];
  return coord;
}

int ProcessTopology::get_coord(int rank, const std::string& axis) const {
  const int i = axis_index(axis);
  DS_CHECK(i >= 0, UsageError, "ProcessTopology: no axis '", axis, "'");
  return get_coord(rank).at(axis);
}

std::string ProcessTopology::get_rank_repr(int rank, const std::vector<std::string>& omit_axes,
                                           const std::string& inner_sep,
                                           const std::string& outer_sep) const {
  const std::set<std::string> omit(omit_axes.begin(), omit_axes.end());
  const auto coord = get_coord(rank);
  std::string out;
  for (const auto& axis : axes_) {
    if (omit.count(axis)) continue;
    char digits[16];
    std::snprintf(digits, sizeof digits, "%02d", coord.at(axis));
    if (!out.empty()) out += outer_sep;
    out += axis + inner_sep + digits;
  }
  return out;
}

std::vector<std::vector<int>> ProcessTopology::get_axis_comm_lists(const std::string& axis) const {
  const int a = axis_index(axis);
  if (a < 0) return {};
  std::vector<std::vector<int>> lists;
  // Every rank with coordinate 0 on `axis` starts one list; ascending ranks visit the other
  // axes' coordinates in row-major order.
  for (int rank = 0; rank < world_size_; ++rank) {
    if (rank / strides_[static_cast<size_t>(a)] % dims_[static_cast<size_t>(a)] != 0) continue;
    std::vector<int> list;
    for (int k = 0; k < dims_[static_cast<size_t>(a)]; ++k) {
      list.push_back(rank + k * strides_[static_cast<size_t>(a)]);
    }
    lists.push_back(std::move(list));
  }
  return lists;
}

std::vector<int> ProcessTopology::filter_match(const std::map<std::string, int>& filter) const {
  for (const auto& [axis, value] : filter) {
    DS_CHECK(has_axis(axis), UsageError, "ProcessTopology::filter_match: no axis '", axis, "'");
  }
  std::vector<int> out;
  for (int rank = 0; rank < world_size_; ++rank) {
    const auto coord = get_coord(rank);
    bool match = true;
    for (const auto& [axis, value] : filter) match = match && coord.at(axis) == value;
    if (match) out.push_back(rank);
  }
  return out;
}

std::vector<int> ProcessTopology::get_axis_list(const std::string& axis, int idx) const {
  if (!has_axis(axis)) return {};
  return filter_match({{axis, idx}});
}

ProcessTopology PipeDataParallelTopology(int num_pp, int num_dp) {
  return ProcessTopology({"pipe", "data"}, {num_pp, num_dp});
}

ProcessTopology PipeModelDataParallelTopology(int num_pp, int num_mp, int num_dp) {
  return ProcessTopology({"pipe", "data", "model"}, {num_pp, num_dp, num_mp});
}

}  // namespace deepspeed
