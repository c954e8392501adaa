// The launcher's paths: see launch.h.
#include "launch.h"

#include "hostfile.h"
#include "local_runner.h"
#include "log.h"
#include "multinode_runner.h"
#include "pid_file.h"
#include "program_path.h"
#include "resource_filter.h"
#include "usage_error.h"

namespace deepspeed::launcher {
namespace {

int run_plan(LaunchPlan plan, const LauncherOptions& options, const HostInfo& host, bool controlled) {
  plan.program_path = resolve_program(options.program, host.path_env);
  for (const std::string& warning : plan.warnings) log_warning(warning);
  LocalRunOptions run;
  run.kill_grace_s = kill_grace_seconds_from_env();
  run.each_rank_log_dir = options.enable_each_rank_log;
  run.controlled_by_stdin = controlled;
  PidFile pid_file(options.save_pid);
  log_info(plan.summary());
  return run_local(plan, run);
}

ResourceRequest request_of(const LauncherOptions& o) {
  return ResourceRequest{o.include, o.exclude, o.num_nodes, o.num_gpus};
}

int run_node_mode(const LauncherOptions& options, const HostInfo& host) {
  WorldInfo world = decode_world_info(options.world_info);
  if (options.node_rank < 0) {
    throw UsageError("--world_info needs --node_rank: this host's index among " + describe_world(world));
  }
  return run_plan(make_node_plan(options, world, options.node_rank, host), options, host, options.stop_on_stdin_eof);
}

// No hostfile: this machine. --include/--exclude select among its GPUs, as DeepSpeed's local pool
// {"localhost": <GPU count>}; otherwise the one-machine plan (--num_gpus, CUDA_VISIBLE_DEVICES).
int run_without_hostfile(const LauncherOptions& options, const HostInfo& host) {
  if (options.num_nodes > 1) {
    throw UsageError("--num_nodes " + std::to_string(options.num_nodes) +
                     ": Num nodes is >1 but no extra nodes available via hostfile (" + options.hostfile +
                     " does not exist)");
  }
  if (options.no_ssh && options.node_rank > 0) {
    throw UsageError("--no_ssh --node_rank " + std::to_string(options.node_rank) +
                     ": without a hostfile this machine is the only host (node 0)");
  }
  if (options.include.empty() && options.exclude.empty()) {
    return run_plan(make_launch_plan(options, host), options, host, false);
  }
  if (host.gpu_count == 0) {
    throw UsageError(std::string(options.include.empty() ? "--exclude" : "--include") +
                     " without a hostfile selects among this machine's GPUs, and it has none; use "
                     "--num_gpus N, or a hostfile with a 'localhost slots=N' line");
  }
  WorldInfo world = select_resources({HostSlots{"localhost", host.gpu_count, 0}}, request_of(options));
  LauncherOptions local = options;
  if (local.master_addr.empty()) local.master_addr = kLocalMasterAddr;
  return run_plan(make_node_plan(local, world, 0, host), local, host, false);
}

}  // namespace

int launch(const LauncherOptions& options, const HostInfo& host) {
  if (!options.world_info.empty()) return run_node_mode(options, host);
  if (options.stop_on_stdin_eof) {
    throw UsageError("--stop_on_stdin_eof belongs to per-node mode: it needs --world_info and --node_rank");
  }

  std::optional<ResourcePool> pool = read_hostfile(options.hostfile);
  if (!pool) return run_without_hostfile(options, host);

  WorldInfo world = select_resources(*pool, request_of(options));
  log_info("hostfile " + options.hostfile + ": using " + describe_world(world));
  if (options.no_ssh) {
    // Matches DeepSpeed's --no_ssh: the same command runs on every host, each with its --node_rank.
    if (options.node_rank < 0 || options.node_rank >= static_cast<int>(world.size())) {
      throw UsageError("--no_ssh needs --node_rank in 0.." + std::to_string(world.size() - 1) +
                       ": this host's index among " + describe_world(world));
    }
    LauncherOptions node = options;
    if (node.master_addr.empty() && world.size() == 1) node.master_addr = kLocalMasterAddr;
    if (node.master_addr.empty()) {
      throw UsageError("--no_ssh across " + std::to_string(world.size()) +
                       " hosts needs --master_addr (the address of host " + world.front().host +
                       "), since no ssh can ask it for one");
    }
    return run_plan(make_node_plan(node, world, node.node_rank, host), node, host, false);
  }
  if (options.node_rank != -1) {
    throw UsageError("--node_rank " + std::to_string(options.node_rank) +
                     " is only for --no_ssh (the launcher numbers the hosts itself otherwise)");
  }
  if (!options.force_multi && world.size() == 1) {
    LauncherOptions local = options;
    if (local.master_addr.empty()) local.master_addr = kLocalMasterAddr;
    return run_plan(make_node_plan(local, world, 0, host), local, host, false);
  }
  PidFile pid_file(options.save_pid);
  return run_multinode(options, world, *pool, host, kill_grace_seconds_from_env());
}

}  // namespace deepspeed::launcher
