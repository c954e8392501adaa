// Flags + machine -> per-rank argv/env/cores: see launch_plan.h.
#include "launch_plan.h"

#include <algorithm>
#include <cctype>

#include "core_list.h"
#include "text_util.h"
#include "usage_error.h"

namespace deepspeed::launcher {
namespace {

void validate_port(const LauncherOptions& options) {
  if (options.master_port < 1 || options.master_port > 65535) {
    throw UsageError("--master_port " + std::to_string(options.master_port) +
                     ": expected a TCP port in 1..65535 (DeepSpeed's default is 29500)");
  }
}

void validate(const LauncherOptions& options) {
  if (options.num_gpus == 0 || options.num_gpus < -1) {
    throw UsageError("--num_gpus " + std::to_string(options.num_gpus) +
                     ": expected a positive number of ranks (or leave it out to use every visible "
                     "GPU, or 1 process on a CPU-only machine)");
  }
  validate_port(options);
}

int choose_world_size(const LauncherOptions& options, const HostInfo& host,
                      const std::vector<std::string>& visible) {
  if (options.num_gpus > 0) return options.num_gpus;
  if (!visible.empty()) return static_cast<int>(visible.size());
  if (host.gpu_count > 0) return host.gpu_count;
  return 1;
}

// Matches DeepSpeed: ranks see exactly the node's devices; LOCAL_RANK indexes into them.
std::vector<std::string> choose_devices(int world_size, const HostInfo& host,
                                        const std::vector<std::string>& visible,
                                        std::vector<std::string>& warnings) {
  std::vector<std::string> devices;
  if (host.gpu_count == 0) return devices;  // CPU-only: --num_gpus counts processes
  if (!visible.empty()) {
    if (world_size > static_cast<int>(visible.size())) {
      throw UsageError("--num_gpus " + std::to_string(world_size) + " but CUDA_VISIBLE_DEVICES=" +
                       join(visible, ",") + " lists " + std::to_string(visible.size()) +
                       " device(s); ask for at most " + std::to_string(visible.size()) +
                       " rank(s) or widen CUDA_VISIBLE_DEVICES");
    }
    devices.assign(visible.begin(), visible.begin() + world_size);
    return devices;
  }
  for (int i = 0; i < world_size; ++i) devices.push_back(std::to_string(i));
  if (world_size > host.gpu_count) {
    warnings.push_back("starting " + std::to_string(world_size) + " rank(s) but only " +
                       std::to_string(host.gpu_count) + " GPU(s) were found; ranks " +
                       std::to_string(host.gpu_count) + ".." + std::to_string(world_size - 1) +
                       " will not find their device");
  }
  return devices;
}

// Matches DeepSpeed's launch.py: cores are split evenly in order and OMP_NUM_THREADS is set to the
// cores per rank; leftover cores stay unused. (DeepSpeed also binds memory with numactl; we don't.)
std::vector<std::vector<int>> choose_cores(const LauncherOptions& options, const HostInfo& host,
                                           int world_size, std::vector<std::string>& warnings) {
  std::vector<std::vector<int>> per_rank(static_cast<std::size_t>(world_size));
  if (!options.bind_cores_to_rank) {
    if (!options.bind_core_list.empty()) {
      warnings.push_back("--bind_core_list has no effect without --bind_cores_to_rank (as in "
                         "DeepSpeed); ranks are not pinned");
    }
    return per_rank;
  }
  std::vector<int> cores = host.available_cores;
  if (!options.bind_core_list.empty()) {
    cores = parse_core_list(options.bind_core_list);
    if (!host.available_cores.empty()) {
      for (int core : cores) {
        if (std::find(host.available_cores.begin(), host.available_cores.end(), core) ==
            host.available_cores.end()) {
          throw UsageError("--bind_core_list " + options.bind_core_list + ": core " +
                           std::to_string(core) + " is not available to this process (allowed: " +
                           format_core_list(host.available_cores) + ")");
        }
      }
    }
  }
  std::size_t per = cores.size() / static_cast<std::size_t>(world_size);
  if (per == 0) {
    throw UsageError("--bind_cores_to_rank: " + std::to_string(cores.size()) + " core(s) (" +
                     format_core_list(cores) + ") cannot give each of " + std::to_string(world_size) +
                     " rank(s) a core; start fewer ranks or list more cores with --bind_core_list");
  }
  for (int r = 0; r < world_size; ++r) {
    auto first = cores.begin() + static_cast<std::ptrdiff_t>(per * static_cast<std::size_t>(r));
    per_rank[static_cast<std::size_t>(r)].assign(first, first + static_cast<std::ptrdiff_t>(per));
  }
  return per_rank;
}

// Fills plan.ranks for `local_count` ranks starting at global rank `first_rank` (DeepSpeed's
// launch.py per-process environment). plan.world_size, node_rank, node_count, master_* and
// cuda_visible_devices must be set.
void add_ranks(LaunchPlan& plan, const LauncherOptions& options, const HostInfo& host, int first_rank,
               int local_count) {
  std::vector<std::vector<int>> cores = choose_cores(options, host, local_count, plan.warnings);
  const std::string world = std::to_string(plan.world_size);
  const std::string local_world = std::to_string(local_count);
  for (int local = 0; local < local_count; ++local) {
    RankLaunch launch;
    launch.rank = first_rank + local;
    // The index on this host. DeepSpeed computes RANK % local count, which is the same whenever
    // every host has the same number of slots and a permutation otherwise.
    launch.local_rank = local;
    launch.argv.push_back(options.program);
    launch.argv.insert(launch.argv.end(), options.program_args.begin(), options.program_args.end());
    // Appended, not inserted after PROGRAM as DeepSpeed inserts it after the script: PROGRAM may be
    // an interpreter (`python3 train.py`), which must not receive the flag itself.
    if (!options.no_local_rank) launch.argv.push_back("--local_rank=" + std::to_string(local));

    launch.env = {
        {"MASTER_ADDR", plan.master_addr},
        {"MASTER_PORT", std::to_string(plan.master_port)},
        {"WORLD_SIZE", world},
        {"CROSS_RANK", std::to_string(plan.node_rank)},
        {"CROSS_SIZE", std::to_string(plan.node_count)},
        {"LOCAL_SIZE", local_world},
        {"LOCAL_WORLD_SIZE", local_world},  // torchrun's name for LOCAL_SIZE
        {"RANK", std::to_string(launch.rank)},
        {"LOCAL_RANK", std::to_string(local)},
    };
    if (!plan.cuda_visible_devices.empty()) {
      launch.env.emplace_back("CUDA_VISIBLE_DEVICES", join(plan.cuda_visible_devices, ","));
    }
    const auto& my_cores = cores[static_cast<std::size_t>(local)];
    if (!my_cores.empty()) {
      launch.cpu_cores = my_cores;
      launch.env.emplace_back("OMP_NUM_THREADS", std::to_string(my_cores.size()));
    }
    // DeepSpeed starts scripts with `python -u`; for a Python PROGRAM behind our pipes this is the
    // same switch, and it keeps rank output flowing line by line instead of at exit.
    launch.env.emplace_back("PYTHONUNBUFFERED", "1");
    plan.ranks.push_back(std::move(launch));
  }
}

}  // namespace

std::vector<std::string> split_device_list(const std::string& value) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= value.size()) {
    std::size_t comma = value.find(',', start);
    std::string item = value.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    item.erase(item.begin(), std::find_if(item.begin(), item.end(), [](unsigned char c) { return !std::isspace(c); }));
    item.erase(std::find_if(item.rbegin(), item.rend(), [](unsigned char c) { return !std::isspace(c); }).base(),
               item.end());
    if (!item.empty()) out.push_back(item);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

LaunchPlan make_launch_plan(const LauncherOptions& options, const HostInfo& host) {
  validate(options);
  LaunchPlan plan;
  std::vector<std::string> visible;
  if (host.cuda_visible_devices) visible = split_device_list(*host.cuda_visible_devices);

  plan.world_size = choose_world_size(options, host, visible);
  plan.master_addr = options.master_addr.empty() ? kLocalMasterAddr : options.master_addr;
  plan.master_port = options.master_port;
  plan.cuda_visible_devices = choose_devices(plan.world_size, host, visible, plan.warnings);
  add_ranks(plan, options, host, 0, plan.world_size);
  return plan;
}

LaunchPlan make_node_plan(const LauncherOptions& options, const WorldInfo& world, int node_rank,
                          const HostInfo& host) {
  validate_port(options);
  const int node_count = static_cast<int>(world.size());
  if (node_rank < 0 || node_rank >= node_count) {
    throw UsageError("--node_rank " + std::to_string(node_rank) + ": expected 0.." +
                     std::to_string(node_count - 1) + " for the " + std::to_string(node_count) +
                     " host(s) " + describe_world(world));
  }
  if (options.master_addr.empty()) {
    throw UsageError("--master_addr is required on host " + std::to_string(node_rank) +
                     " of a multi-host job: give the address of the first host");
  }
  const NodeSlots& node = world[static_cast<std::size_t>(node_rank)];
  LaunchPlan plan;
  plan.world_size = world_size(world);
  plan.node_rank = node_rank;
  plan.node_count = node_count;
  plan.master_addr = options.master_addr;
  plan.master_port = options.master_port;
  if (host.gpu_count > 0) {
    // Matches launch.py: the ranks see exactly this host's slots and index them by LOCAL_RANK.
    for (int slot : node.slots) {
      plan.cuda_visible_devices.push_back(std::to_string(slot));
      if (slot >= host.gpu_count) {
        plan.warnings.push_back("host " + node.host + " slot " + std::to_string(slot) + " but only " +
                                std::to_string(host.gpu_count) + " GPU(s) were found here");
      }
    }
  }
  add_ranks(plan, options, host, first_rank_of_node(world, node_rank), static_cast<int>(node.slots.size()));
  return plan;
}

std::string LaunchPlan::summary() const {
  const std::string program = program_path.empty() ? (ranks.empty() ? "" : ranks[0].argv[0]) : program_path;
  std::string out;
  if (node_count > 1 || world_size != static_cast<int>(ranks.size())) {
    out = "host " + std::to_string(node_rank) + " of " + std::to_string(node_count) + ": launching rank(s) " +
          (ranks.empty() ? std::string("none")
                         : std::to_string(ranks.front().rank) + "-" + std::to_string(ranks.back().rank)) +
          " of " + std::to_string(world_size) + " of " + program;
  } else {
    out = "launching " + std::to_string(world_size) + " rank(s) of " + program + " on this machine";
  }
  out += " (MASTER_ADDR=" + master_addr + " MASTER_PORT=" + std::to_string(master_port);
  if (!cuda_visible_devices.empty()) out += " CUDA_VISIBLE_DEVICES=" + join(cuda_visible_devices, ",");
  out += ")";
  if (!ranks.empty() && !ranks[0].cpu_cores.empty()) {
    out += "; cores:";
    for (const auto& r : ranks) out += " rank " + std::to_string(r.rank) + "=" + format_core_list(r.cpu_cores);
  }
  return out;
}

}  // namespace deepspeed::launcher
