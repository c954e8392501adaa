// The process groups of ZeRO-3's variants (stage3_groups.h).
#include "runtime/zero/stage3_groups.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "util/check.h"
#include "util/env.h"
#include "util/logging.h"

namespace deepspeed::runtime {
namespace {

// Creates one group per list (collectively, every rank in the same order, as new_group wants)
// and returns the one holding this rank. Lists of one rank need no communicator.
comm::Group mine_of(const std::vector<std::vector<int>>& lists, const std::string& name) {
  const int me = comm::get_rank();
  comm::Group out;
  for (const auto& ranks : lists) {
    const bool member = std::find(ranks.begin(), ranks.end(), me) != ranks.end();
    if (ranks.size() == 1) {
      if (member) out = comm::self_group(name);
      continue;
    }
    comm::Group g = comm::new_group(ranks, name);
    if (member) out = g;
  }
  return out;
}

// Created once per layout and kept for the life of the process, as DeepSpeed keeps its groups
// (and as moe::expert groups are): zero::Init and the engine share them, and a group is never
// torn down while a peer may still be connecting to it.
std::map<std::string, MicsGroups>& registry() {
  static std::map<std::string, MicsGroups> groups;
  return groups;
}

std::map<std::string, comm::Group>& hpz_registry() {
  static std::map<std::string, comm::Group> groups;
  return groups;
}

std::map<std::string, NodeGroups>& qgz_registry() {
  static std::map<std::string, NodeGroups> groups;
  return groups;
}

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}

}  // namespace

int mics_ranks_per_node() {
  if (auto n = env::get_int("NDEV_PER_NODE")) return static_cast<int>(*n);
  return comm::get_local_world_size();
}

std::optional<MicsGroups> make_mics_groups(const DeepSpeedConfig& config,
                                           const comm::Group& dp_group, bool has_mpu) {
  const auto& z = config.zero_optimization;
  if (z.stage != 3 || z.mics_shard_size <= 0) return std::nullopt;
  const int shard = static_cast<int>(z.mics_shard_size);
  const int world = comm::get_world_size();
  DS_CHECK(!has_mpu, NotSupportedError, config.source,
           ": zero_optimization.mics_shard_size with an mpu is not supported yet (MiCS lays its "
           "shard groups over the whole world)");
  DS_CHECK(dp_group.size() == world, NotSupportedError, config.source,
           ": zero_optimization.mics_shard_size needs the data-parallel group to be the world");
  // Matches DeepSpeed's _generate_mics_config assertion.
  DS_CHECK(world % shard == 0, ConfigError, config.source, ": zero_optimization.mics_shard_size (",
           shard, ") does not divide the data-parallel size (", world, ")");
  const int per_node = z.mics_hierarchical_params_gather ? mics_ranks_per_node() : 0;
  // Matches DeepSpeed: the hierarchy needs a shard group over more than one node, whole nodes.
  const int span = per_node > 0 ? shard / per_node : 0;
  DS_CHECK(!z.mics_hierarchical_params_gather || (span > 1 && shard % per_node == 0), ConfigError,
           config.source, ": zero_optimization.mics_hierarchical_params_gather needs a shard group "
           "that spans several whole nodes, but mics_shard_size is ", shard, " and a node has ",
           per_node, " ranks (NDEV_PER_NODE, else LOCAL_WORLD_SIZE)");
  const std::string key = std::to_string(world) + "/" + std::to_string(shard) + "/" +
                          std::to_string(per_node);
  std::lock_guard<std::mutex> lock(registry_mutex());
  if (auto it = registry().find(key); it != registry().end()) return it->second;
  std::vector<std::vector<int>> shards(world / shard), replicas(shard);
  for (int r = 0; r < world; ++r) {
    shards[r / shard].push_back(r);
    replicas[r % shard].push_back(r);
  }
  MicsGroups g;
  g.shard = mine_of(shards, "mics_shard");
  g.replica = mine_of(replicas, "mics_replica");
  if (!z.mics_hierarchical_params_gather) return registry()[key] = g;
  std::vector<std::vector<int>> intra, inter;
  for (const auto& ranks : shards) {
    for (int n = 0; n < span; ++n) {
      intra.emplace_back(ranks.begin() + n * per_node, ranks.begin() + (n + 1) * per_node);
    }
    for (int l = 0; l < per_node; ++l) {
      std::vector<int> same_local;
      for (int n = 0; n < span; ++n) same_local.push_back(ranks[n * per_node + l]);
      inter.push_back(std::move(same_local));
    }
  }
  g.intra_node = mine_of(intra, "mics_intra_node");
  g.inter_node = mine_of(inter, "mics_inter_node");
  return registry()[key] = g;
}

std::optional<comm::Group> make_hpz_group(const DeepSpeedConfig& config,
                                          const comm::Group& dp_group, bool has_mpu) {
  const auto& z = config.zero_optimization;
  if (z.stage != 3 || z.zero_hpz_partition_size <= 1) return std::nullopt;
  const int world = comm::get_world_size();
  // Matches DeepSpeed: min(H, world) ranks per group, which must divide the world.
  const int size = static_cast<int>(std::min<int64_t>(z.zero_hpz_partition_size, world));
  DS_CHECK(!has_mpu && dp_group.size() == world, NotSupportedError, config.source,
           ": zero_optimization.zero_hpz_partition_size with an mpu is not supported yet (its "
           "groups are laid over the whole world)");
  DS_CHECK(world % size == 0, ConfigError, config.source,
           ": zero_optimization.zero_hpz_partition_size (", z.zero_hpz_partition_size,
           ") does not divide the data-parallel size (", world, ")");
  const std::string key = std::to_string(world) + "/" + std::to_string(size);
  std::lock_guard<std::mutex> lock(registry_mutex());
  if (auto it = hpz_registry().find(key); it != hpz_registry().end()) return it->second;
  std::vector<std::vector<int>> lists(world / size);
  for (int r = 0; r < world; ++r) lists[r / size].push_back(r);
  return hpz_registry()[key] = mine_of(lists, "zero_hpz");
}

std::optional<NodeGroups> make_qgz_groups(const DeepSpeedConfig& config,
                                          const comm::Group& dp_group, bool has_mpu) {
  const auto& z = config.zero_optimization;
  if (z.stage != 3 || !z.zero_quantized_gradients) return std::nullopt;
  const int world = comm::get_world_size();
  DS_CHECK(!has_mpu && dp_group.size() == world, NotSupportedError, config.source,
           ": zero_optimization.zero_quantized_gradients with an mpu is not supported yet (its "
           "all-to-alls are laid over the whole world)");
  DS_CHECK(z.mics_shard_size <= 0, NotSupportedError, config.source,
           ": zero_optimization.zero_quantized_gradients together with mics_shard_size is not "
           "supported yet");
  // Matches DeepSpeed's assertion: the all-to-alls replace the reduce-scatter.
  DS_CHECK(z.reduce_scatter, ConfigError, config.source,
           ": zero_optimization.zero_quantized_gradients needs zero_optimization.reduce_scatter");
  const int per_node = mics_ranks_per_node();
  DS_CHECK(per_node > 0 && world % per_node == 0, ConfigError, config.source,
           ": zero_optimization.zero_quantized_gradients needs whole nodes, but the world has ",
           world, " ranks and a node ", per_node, " (NDEV_PER_NODE, else LOCAL_WORLD_SIZE)");
  if (per_node == world) {
    log::warn_rank0(config.source + ": zero_optimization.zero_quantized_gradients has no "
                    "effect on one node (qgZ quantizes the reduction across nodes; here all " +
                    std::to_string(world) + " ranks share one); gradients are reduced exactly");
    return std::nullopt;
  }
  const std::string key = std::to_string(world) + "/" + std::to_string(per_node);
  std::lock_guard<std::mutex> lock(registry_mutex());
  if (auto it = qgz_registry().find(key); it != qgz_registry().end()) return it->second;
  std::vector<std::vector<int>> intra(world / per_node), inter(per_node);
  for (int r = 0; r < world; ++r) {
    intra[r / per_node].push_back(r);
    inter[r % per_node].push_back(r);
  }
  NodeGroups g;
  g.intra_node = mine_of(intra, "zero_qgz_intra_node");
  g.inter_node = mine_of(inter, "zero_qgz_inter_node");
  return qgz_registry()[key] = g;
}

}  // namespace deepspeed::runtime
