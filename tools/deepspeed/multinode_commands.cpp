// Multi-node command lines: see multinode_commands.h.
#include "multinode_commands.h"

#include <algorithm>

#include "env_exports.h"
#include "resource_filter.h"
#include "shell_words.h"
#include "text_util.h"
#include "usage_error.h"

namespace deepspeed::launcher {
namespace {

// Refuses a per-node flag that a backend starting PROGRAM directly (mpirun, srun) cannot apply.
void refuse_per_node_flags(const LauncherOptions& o) {
  const std::string backend = "--launcher " + o.launcher;
  auto refuse = [&](const std::string& flag, const std::string& instead) {
    throw UsageError(flag + " is not supported with " + backend + ": its ranks start without the per-node "
                     "launcher that applies it; " + instead);
  };
  if (o.bind_cores_to_rank) refuse("--bind_cores_to_rank", "bind with the backend's own options in --launcher_args");
  if (!o.enable_each_rank_log.empty()) refuse("--enable_each_rank_log", "use the backend's output options in --launcher_args");
  if (!o.venv_script.empty()) refuse("--venv_script", "activate the environment before launching (it is exported)");
}

bool launcher_args_set(const std::vector<std::string>& args, const std::string& mca_name) {
  for (std::size_t i = 0; i + 1 < args.size(); ++i) {
    if ((args[i] == "--mca" || args[i] == "-mca") && args[i + 1] == mca_name) return true;
  }
  return false;
}

std::vector<std::string> with_program(std::vector<std::string> argv, const LauncherOptions& o) {
  argv.push_back(o.program);
  argv.insert(argv.end(), o.program_args.begin(), o.program_args.end());
  return argv;
}

// Whole hosts named by an --include/--exclude spec; a spec naming slots is refused.
std::vector<std::string> whole_hosts(const std::string& text, const std::string& flag) {
  std::vector<std::string> hosts;
  for (const NodeSpec& spec : parse_node_specs(text, flag)) {
    if (!spec.slots.empty()) {
      throw UsageError(flag + " '" + text + "': --launcher slurm cannot place ranks on particular slots of '" +
                       spec.host + "' (Slurm allocates whole nodes); name whole hosts, e.g. " + spec.host);
    }
    hosts.push_back(spec.host);
  }
  return hosts;
}

}  // namespace

bool is_mpirun_launcher(const std::string& l) {
  return l == kOpenMpiLauncher || l == kMpichLauncher || l == kImpiLauncher || l == kMvapichLauncher;
}

void validate_launcher_name(const std::string& l) {
  if (l == kPdshLauncher || l == kSlurmLauncher || is_mpirun_launcher(l)) return;
  if (l == "jsrun") {
    throw UsageError("--launcher " + l + " is not supported by deepspeed-cpp; use pdsh (ssh to each host), "
                     "openmpi, mpich, impi or mvapich (mpirun) or slurm (srun)");
  }
  throw UsageError("--launcher '" + l + "': unknown launcher; expected pdsh, openmpi, mpich, impi, mvapich "
                   "or slurm");
}

void validate_multinode_options(const LauncherOptions& o) {
  const std::string& l = o.launcher;
  validate_launcher_name(l);
  if (l == kPdshLauncher) return;
  if (is_mpirun_launcher(l)) {
    // Matches DeepSpeed's OpenMPIRunner (and MPICH/IMPI/MVAPICH) validate_args.
    if (!o.include.empty() || !o.exclude.empty()) {
      throw UsageError("--launcher " + l + " does not support worker include/exclusion (--include/--exclude); "
                       "write the hosts to use in the hostfile");
    }
    if (o.num_nodes != -1 || o.num_gpus != -1) {
      throw UsageError("--launcher " + l + " does not support limiting num nodes/gpus (--num_nodes/--num_gpus); "
                       "write the hosts and slots to use in the hostfile");
    }
    refuse_per_node_flags(o);
    return;
  }
  refuse_per_node_flags(o);  // slurm
}

std::vector<std::string> node_launcher_argv(const MultiNodeJob& job, int node_rank) {
  const LauncherOptions& o = job.options;
  std::vector<std::string> argv = {job.launcher_path,
                                   "--world_info=" + encode_world_info(job.world),
                                   "--node_rank=" + std::to_string(node_rank),
                                   "--master_addr=" + job.master_addr,
                                   "--master_port=" + std::to_string(o.master_port),
                                   "--stop_on_stdin_eof",
                                   "--log_level=" + o.log_level};
  if (o.quiet) argv.push_back("--quiet");
  if (o.no_local_rank) argv.push_back("--no_local_rank");
  if (o.save_pid) argv.push_back("--save_pid");
  if (!o.enable_each_rank_log.empty()) argv.push_back("--enable_each_rank_log=" + o.enable_each_rank_log);
  if (o.bind_cores_to_rank) argv.push_back("--bind_cores_to_rank");
  if (!o.bind_core_list.empty()) argv.push_back("--bind_core_list=" + o.bind_core_list);
  argv.push_back("--");
  return with_program(argv, o);
}

std::string remote_shell_command(const MultiNodeJob& job, int node_rank) {
  std::string command;
  if (!job.options.venv_script.empty()) command += ". " + shell_quote(job.options.venv_script) + " && ";
  command += "cd " + shell_quote(job.cwd) + " && ";
  if (!job.exports.empty()) {
    command += "export";
    for (const auto& [name, value] : job.exports) command += " " + name + "=" + shell_quote(value);
    command += " && ";
  }
  return command + "exec " + shell_join(node_launcher_argv(job, node_rank));
}

std::vector<std::string> ssh_probe_argv(const LauncherOptions& o, const std::string& host,
                                        const std::vector<std::string>& command) {
  std::vector<std::string> argv = {"ssh"};
  if (o.launcher == kPdshLauncher) {
    for (std::string& word : split_shell_words(o.launcher_args, "--launcher_args")) argv.push_back(word);
  }
  for (const char* option : {"-T", "-x", "-a", "-o", "BatchMode=yes", "-o", "PasswordAuthentication=no"}) {
    argv.emplace_back(option);
  }
  if (o.ssh_port > 0) {
    argv.emplace_back("-p");
    argv.push_back(std::to_string(o.ssh_port));
  }
  argv.push_back(host);
  argv.push_back(shell_join(command));
  return argv;
}

std::vector<std::string> ssh_argv(const MultiNodeJob& job, int node_rank) {
  const LauncherOptions& o = job.options;
  std::vector<std::string> argv = {"ssh"};
  for (std::string& word : split_shell_words(o.launcher_args, "--launcher_args")) argv.push_back(word);
  // Like pdsh's ssh module: no tty, no X11 or agent forwarding, never a password prompt; and a
  // host that stops answering is noticed within ~30 s instead of the TCP timeout.
  for (const char* option : {"-T", "-x", "-a", "-o", "BatchMode=yes", "-o", "ServerAliveInterval=10", "-o",
                             "ServerAliveCountMax=3"}) {
    argv.emplace_back(option);
  }
  if (o.ssh_port > 0) {
    argv.emplace_back("-p");
    argv.push_back(std::to_string(o.ssh_port));
  }
  argv.push_back(job.world[static_cast<std::size_t>(node_rank)].host);
  argv.push_back(remote_shell_command(job, node_rank));
  return argv;
}

std::vector<std::string> mpirun_argv(const MultiNodeJob& job) {
  const LauncherOptions& o = job.options;
  std::vector<std::string> launcher_args = split_shell_words(o.launcher_args, "--launcher_args");
  std::vector<std::string> argv = {"mpirun", "-n", std::to_string(total_slots(job.pool)), "-hostfile", o.hostfile,
                                   "--mca", "btl", "^openib"};
  // Matches DeepSpeed: eth0 unless the user chose the TCP interfaces.
  if (!launcher_args_set(launcher_args, "btl_tcp_if_include")) {
    argv.insert(argv.end(), {"--mca", "btl_tcp_if_include", "eth0"});
  }
  argv.insert(argv.end(), launcher_args.begin(), launcher_args.end());
  std::vector<EnvVar> exports = {{"UCX_TLS", "tcp"}};  // DeepSpeed's OpenMPIRunner adds it first
  for (const auto& [name, value] : job.exports) set_var(exports, name, value);
  // Not in DeepSpeed's command: there the ranks find rank 0 through MPI itself (mpi4py); ours
  // rendezvous through MASTER_ADDR:MASTER_PORT.
  set_var(exports, "MASTER_ADDR", job.master_addr);
  set_var(exports, "MASTER_PORT", std::to_string(o.master_port));
  for (const auto& [name, value] : exports) {
    argv.emplace_back("-x");
    argv.push_back(name + "=" + value);
  }
  return with_program(argv, o);
}

namespace {

// The slots of every host, which mpich, impi and mvapich pass as one -ppn (DeepSpeed's check).
int slots_per_host(const MultiNodeJob& job, const std::string& mpi) {
  const int slots = job.pool.front().slots;
  for (const HostSlots& h : job.pool) {
    if (h.slots != slots) {
      throw UsageError(mpi + " requires same number of devices per node: the hostfile gives " + job.pool.front().host +
                       " " + std::to_string(slots) + " slots and " + h.host + " " + std::to_string(h.slots));
    }
  }
  return slots;
}

std::string host_list(const ResourcePool& pool) {
  std::vector<std::string> hosts;
  for (const HostSlots& h : pool) hosts.push_back(h.host);
  return join(hosts, ",");
}

// Hydra's (MPICH, Intel MPI) -genv exports: the job's, then the rendezvous and the sizes.
void add_genv(std::vector<std::string>& argv, const MultiNodeJob& job, int ppn) {
  std::vector<EnvVar> exports = job.exports;
  set_var(exports, "MASTER_ADDR", job.master_addr);
  set_var(exports, "MASTER_PORT", std::to_string(job.options.master_port));
  set_var(exports, "WORLD_SIZE", std::to_string(total_slots(job.pool)));
  set_var(exports, "LOCAL_SIZE", std::to_string(ppn));
  for (const auto& [name, value] : exports) argv.insert(argv.end(), {"-genv", name, value});
}

}  // namespace

std::vector<std::string> mpich_argv(const MultiNodeJob& job) {
  const LauncherOptions& o = job.options;
  const int ppn = slots_per_host(job, "MPICH");
  std::vector<std::string> argv = {"mpirun", "-n", std::to_string(total_slots(job.pool)), "-ppn", std::to_string(ppn)};
  for (std::string& word : split_shell_words(o.launcher_args, "--launcher_args")) argv.push_back(word);
  add_genv(argv, job, ppn);
  argv.insert(argv.end(), {"-hosts", host_list(job.pool)});
  return with_program(argv, o);
}

std::vector<std::string> impi_argv(const MultiNodeJob& job) {
  const LauncherOptions& o = job.options;
  const int ppn = slots_per_host(job, "Intel MPI");
  std::vector<std::string> argv = {"mpirun", "-ppn", std::to_string(ppn)};
  for (std::string& word : split_shell_words(o.launcher_args, "--launcher_args")) argv.push_back(word);
  add_genv(argv, job, ppn);
  // Matches DeepSpeed: Intel MPI's own core pinning off.
  argv.insert(argv.end(), {"-genv", "I_MPI_PIN", "0", "-hosts", host_list(job.pool)});
  // One MPMD section a rank, which tells it its RANK and LOCAL_RANK.
  for (int rank = 0; rank < total_slots(job.pool); ++rank) {
    if (rank > 0) argv.emplace_back(":");
    argv.insert(argv.end(), {"-n", "1", "-env", "RANK", std::to_string(rank), "-env", "LOCAL_RANK",
                             std::to_string(rank % ppn)});
    argv = with_program(argv, o);
  }
  return argv;
}

std::string mvapich_hosts_file_text(const MultiNodeJob& job) {
  std::string text;
  for (const HostSlots& h : job.pool) text += h.host + "\n";
  return text;
}

std::vector<std::string> mvapich_argv(const MultiNodeJob& job, const std::string& hosts_file) {
  const LauncherOptions& o = job.options;
  const int ppn = slots_per_host(job, "mvapich");
  std::vector<std::string> argv = {"mpirun", "-np", std::to_string(total_slots(job.pool)), "-ppn",
                                   std::to_string(ppn), "--hostfile", hosts_file};
  for (std::string& word : split_shell_words(o.launcher_args, "--launcher_args")) argv.push_back(word);
  // DeepSpeed's MVAPICHRunner exports these first (MV2_USE_CUDA too on a CUDA accelerator: the
  // ranks here decide their device themselves).
  std::vector<EnvVar> exports = {{"MV2_SMP_USE_CMA", "0"},         {"MV2_DEBUG_SHOW_BACKTRACE", "1"},
                                 {"MV2_SUPPORT_DL", "1"},          {"MV2_ENABLE_AFFINITY", "0"},
                                 {"MV2_INTER_ALLGATHER_TUNING", "5"}, {"MV2_CUDA_USE_NAIVE", "0"}};
  for (const auto& [name, value] : job.exports) set_var(exports, name, value);
  // Not in DeepSpeed's command (its ranks rendezvous through MPI): ours through MASTER_ADDR.
  set_var(exports, "MASTER_ADDR", job.master_addr);
  set_var(exports, "MASTER_PORT", std::to_string(o.master_port));
  for (const auto& [name, value] : exports) argv.insert(argv.end(), {"-env", name + "=" + value});
  return with_program(argv, o);
}

std::vector<std::string> srun_argv(const MultiNodeJob& job) {
  const LauncherOptions& o = job.options;
  std::vector<std::string> argv = {"srun", "-n", std::to_string(world_size(job.world))};
  for (std::string& word : split_shell_words(o.launcher_args, "--launcher_args")) argv.push_back(word);
  // DeepSpeed passes --include, which srun does not have; --nodelist is srun's name for it.
  if (!o.include.empty()) argv.push_back("--nodelist=" + join(whole_hosts(o.include, "--include"), ","));
  if (!o.exclude.empty()) argv.push_back("--exclude=" + join(whole_hosts(o.exclude, "--exclude"), ","));
  if (o.num_nodes > 0) argv.push_back("--nodes=" + std::to_string(o.num_nodes));
  if (o.num_gpus > 0) argv.push_back("--ntasks-per-node=" + std::to_string(o.num_gpus));
  std::vector<EnvVar> exports = job.exports;
  set_var(exports, "MASTER_ADDR", job.master_addr);
  set_var(exports, "MASTER_PORT", std::to_string(o.master_port));
  std::string export_list = "--export=ALL";
  for (const auto& [name, value] : exports) {
    if (value.find(',') != std::string::npos) {
      throw UsageError("cannot pass " + name + "='" + value + "' through srun --export: the value contains ',' "
                       "(srun's list separator); set it in the job's environment instead");
    }
    export_list += "," + name + "=" + value;
  }
  argv.push_back(export_list);
  return with_program(argv, o);
}

}  // namespace deepspeed::launcher
