// The expert-parallel and expert-data-parallel groups (DeepSpeed's utils/groups.py
// _create_expert_and_data_parallel without pipeline or tensor parallelism), created once per
// "ep_size_<e>" name and kept for the life of the process, as DeepSpeed's module-level dicts.
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
                                                    bool use_data_before_expert_parallelism) {
  const std::string name = "ep_size_" + std::to_string(ep_size);
  if (const ExpertGroups* g = find_expert_groups(name)) return *g;
  comm::init_distributed();
  const int world = comm::get_world_size();
  const ExpertGroupRanks lists =
      expert_group_ranks(world, ep_size, use_data_before_expert_parallelism);
  auto groups = std::make_unique<ExpertGroups>();
  groups->name = name;
  groups->ep_size = ep_size;
  // Every rank makes every group, data-parallel ones first (c10d: same calls, same order).
  for (const auto& ranks : lists.expert_data_parallel) {
    comm::Group g = comm::new_group(ranks, name + "_expert_data_parallel");
    if (g.is_member()) groups->expert_data_parallel = g;
    log::info_rank0("MoE: expert data parallel group " + name + " " + ranks_text(ranks));
  }
  for (const auto& ranks : lists.expert_parallel) {
    comm::Group g = comm::new_group(ranks, name + "_expert_parallel");
    if (g.is_member()) groups->expert_parallel = g;
    log::info_rank0("MoE: expert parallel group " + name + " " + ranks_text(ranks));
  }
  DS_INTERNAL_ASSERT(groups->expert_parallel.valid() && groups->expert_data_parallel.valid(),
                     "rank ", comm::get_rank(), " is in no ", name, " group");
  auto& slot = registry()[name];
  slot = std::move(groups);
  return *slot;
}

}  // namespace deepspeed::moe
