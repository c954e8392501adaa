// The expert-parallel and expert-data-parallel groups (DeepSpeed's utils/groups.py
// _create_expert_and_data_parallel, and _create_expert_data_and_model_parallel with model
// parallelism: the same cut of each model-parallel rank's data-parallel group), created once
// per "ep_size_<e>" name and kept for the life of the process, as DeepSpeed's module-level
// dicts.
#include <algorithm>
#include <map>
#include <mutex>

#include "deepspeed/moe.h"
#include "util/check.h"
#include "util/logging.h"

namespace deepspeed::moe {
namespace {

std::map<std::string, std::unique_ptr<ExpertGroups>>& registry() {
  static std::map<std::string, std::unique_ptr<ExpertGroups>> groups;
  return groups;
}

std::string ranks_text(const std::vector<int>& ranks) {
  std::string s = "[";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s + "]";
}

// Every rank's data-parallel group (global ranks), each once, ordered by its first rank: one
// all-gather over the world of each rank's group (none when it is the world).
std::vector<std::vector<int>> all_data_parallel_groups(const std::vector<int>& mine) {
  const int world = comm::get_world_size();
  if (static_cast<int>(mine.size()) == world) return {mine};
  const int64_t n = static_cast<int64_t>(mine.size());
  at::Tensor in = at::empty({n}, at::kLong);
  std::copy(mine.begin(), mine.end(), in.data_ptr<int64_t>());
  at::Tensor all = at::empty({world * n}, at::kLong);
  comm::all_gather(all, in);
  const int64_t* every = all.data_ptr<int64_t>();
  std::vector<std::vector<int>> out;
  for (int r = 0; r < world; ++r) {
    std::vector<int> group(every + r * n, every + (r + 1) * n);
    if (std::find(out.begin(), out.end(), group) == out.end()) out.push_back(std::move(group));
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

ExpertGroupRanks expert_group_ranks(int world, int64_t ep_size,
                                    bool use_data_before_expert_parallelism) {
  DS_CHECK(ep_size >= 1 && world % ep_size == 0, UsageError, "MoE: ep_size (", ep_size,
           ") must divide the data-parallel world size (", world, ")");
  const int e = static_cast<int>(ep_size);
  const int ep_stride = world / e;  // ranks per expert-data-parallel group
  ExpertGroupRanks out;
  for (int i = 0; i < e; ++i) {
    std::vector<int> ranks;
    if (use_data_before_expert_parallelism) {
      for (int r = i * ep_stride; r < (i + 1) * ep_stride; ++r) ranks.push_back(r);
    } else {
      for (int r = i; r < world; r += e) ranks.push_back(r);
    }
    out.expert_data_parallel.push_back(ranks);
  }
  if (use_data_before_expert_parallelism) {
    for (int i = 0; i < ep_stride; ++i) {
      std::vector<int> ranks;
      for (int r = i; r < world; r += ep_stride) ranks.push_back(r);
      out.expert_parallel.push_back(ranks);
    }
  } else {
    for (int i = 0; i < world / e; ++i) {
      std::vector<int> ranks;
      for (int r = i * e; r < (i + 1) * e; ++r) ranks.push_back(r);
      out.expert_parallel.push_back(ranks);
    }
  }
  return out;
}

const ExpertGroups* find_expert_groups(const std::string& name) {
  auto it = registry().find(name);
  return it == registry().end() ? nullptr : it->second.get();
}

const ExpertGroups& create_expert_and_data_parallel(int64_t ep_size,
                                                    bool use_data_before_expert_parallelism,
                                                    const comm::Group* data_parallel) {
  comm::init_distributed();
  const int world = comm::get_world_size();
  std::vector<int> mine;  // this rank's data-parallel group
  if (data_parallel != nullptr) {
    mine = data_parallel->ranks();
  } else {
    for (int r = 0; r < world; ++r) mine.push_back(r);
  }
  const std::string name = "ep_size_" + std::to_string(ep_size);
  if (const ExpertGroups* g = find_expert_groups(name)) {
    const auto& known = g->data_parallel_groups;
    DS_CHECK(std::find(known.begin(), known.end(), mine) != known.end(), UsageError, "MoE: the ",
             name, " groups were made from other data-parallel groups than this rank's ",
             ranks_text(mine), " (one layout per ep_size and process, as DeepSpeed's)");
    return *g;
  }
  auto groups = std::make_unique<ExpertGroups>();
  groups->name = name;
  groups->ep_size = ep_size;
  groups->data_parallel_groups = all_data_parallel_groups(mine);
  // The same cut of every data-parallel group, in global ranks; every rank makes every group,
  // expert-data-parallel ones first (c10d: same calls, same order).
  std::vector<ExpertGroupRanks> cuts;
  for (const auto& dp : groups->data_parallel_groups) {
    ExpertGroupRanks lists = expert_group_ranks(static_cast<int>(dp.size()), ep_size,
                                                use_data_before_expert_parallelism);
    for (auto* kind : {&lists.expert_data_parallel, &lists.expert_parallel}) {
      for (auto& ranks : *kind) {
        for (int& r : ranks) r = dp[static_cast<size_t>(r)];
      }
    }
    cuts.push_back(std::move(lists));
  }
  for (const auto& cut : cuts) {
    for (const auto& ranks : cut.expert_data_parallel) {
      comm::Group g = comm::new_group(ranks, name + "_expert_data_parallel");
      if (g.is_member()) groups->expert_data_parallel = g;
      log::info_rank0("MoE: expert data parallel group " + name + " " + ranks_text(ranks));
    }
  }
  for (const auto& cut : cuts) {
    for (const auto& ranks : cut.expert_parallel) {
      comm::Group g = comm::new_group(ranks, name + "_expert_parallel");
      if (g.is_member()) groups->expert_parallel = g;
      log::info_rank0("MoE: expert parallel group " + name + " " + ranks_text(ranks));
    }
  }
  DS_INTERNAL_ASSERT(groups->expert_parallel.valid() && groups->expert_data_parallel.valid(),
                     "rank ", comm::get_rank(), " is in no ", name, " group");
  auto& slot = registry()[name];
  slot = std::move(groups);
  return *slot;
}

}  // namespace deepspeed::moe
