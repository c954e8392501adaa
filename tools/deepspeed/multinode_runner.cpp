// The multi-node controller: see multinode_runner.h.
#include "multinode_runner.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "command_capture.h"
#include "env_exports.h"
#include "log.h"
#include "multinode_commands.h"
#include "process_runner.h"
#include "shell_words.h"
#include "text_util.h"
#include "usage_error.h"

namespace deepspeed::launcher {
namespace {

constexpr double kSshProbeTimeoutSeconds = 30.0;

// Matches DeepSpeed's runner: `ssh -o PasswordAuthentication=no HOST hostname` must work.
void check_ssh(const LauncherOptions& o, const std::string& first_host) {
  CaptureResult r = run_and_capture(ssh_probe_argv(o, first_host, {"hostname"}), kSshProbeTimeoutSeconds);
  if (r.exit_code == 0) return;
  std::string why = r.timed_out ? "no answer in 30 s" : std::string(trim(r.err));
  throw UsageError("Using hostfile at " + o.hostfile + " but host=" + first_host +
                   " was not reachable via ssh (" + (why.empty() ? "ssh exited " + std::to_string(r.exit_code) : why) +
                   "). If you are running with a single node please remove " + o.hostfile +
                   " or setup passwordless ssh (or pass ssh options in --launcher_args, e.g. \"-i KEY\")");
}

// Matches DeepSpeed's runner: the first address `hostname -I` prints on the first host.
std::string first_host_address(const LauncherOptions& o, const std::string& first_host) {
  CaptureResult r = run_and_capture(ssh_probe_argv(o, first_host, {"hostname", "-I"}), kSshProbeTimeoutSeconds);
  std::istringstream words(r.out);
  std::string address;
  words >> address;
  if (r.exit_code != 0 || address.empty()) {
    std::string why = r.timed_out ? "no answer in 30 s" : std::string(trim(r.err));
    throw UsageError("Unable to detect suitable master address via `ssh " + first_host + " hostname -I` (" +
                     (why.empty() ? "it printed no address" : why) +
                     "), please manually specify one via --master_addr");
  }
  return address;
}

std::string backend_program(const std::string& launcher) {
  if (is_mpirun_launcher(launcher)) return "mpirun";
  if (launcher == kSlurmLauncher) return "srun";
  return "ssh";
}

// Where Debian has the backend's program.
std::string install_hint(const std::string& launcher) {
  if (launcher == kPdshLauncher) return " (Debian: apt-get install openssh-client)";
  if (launcher == kOpenMpiLauncher) return " (Debian: apt-get install openmpi-bin)";
  if (launcher == kMpichLauncher) return " (Debian: apt-get install mpich)";
  return "";
}

}  // namespace

int run_multinode(const LauncherOptions& options, const WorldInfo& world, const ResourcePool& pool,
                  const HostInfo& host, double kill_grace_s) {
  validate_multinode_options(options);
  const std::string program = backend_program(options.launcher);
  std::optional<std::string> program_path = find_on_path(program, host.path_env);
  if (!program_path) {
    throw UsageError("launcher '" + options.launcher + "' not installed: '" + program + "' is not on PATH" +
                     install_hint(options.launcher));
  }

  MultiNodeJob job;
  job.options = options;
  job.world = world;
  job.pool = pool;
  job.exports = collect_exports(host);
  job.launcher_path = host.self_exe;
  job.cwd = host.cwd;

  const std::string& first_host = world.front().host;
  if (!options.no_ssh_check) check_ssh(options, first_host);
  job.master_addr = options.master_addr;
  if (job.master_addr.empty()) {
    job.master_addr = first_host_address(options, first_host);
    log_info("Using IP address of " + job.master_addr + " for node " + first_host);
  }

  if (options.launcher == kPdshLauncher) {
    log_info("launching " + std::to_string(world_size(world)) + " rank(s) on " + std::to_string(world.size()) +
             " host(s) " + describe_world(world) + " over ssh (MASTER_ADDR=" + job.master_addr +
             " MASTER_PORT=" + std::to_string(options.master_port) + ")");
    for (std::size_t n = 0; n < world.size(); ++n) {
      log_debug("cmd = " + shell_join(ssh_argv(job, static_cast<int>(n))));
    }
    std::vector<ChildSpec> children;
    for (std::size_t n = 0; n < world.size(); ++n) {
      ChildSpec child;
      child.label = "host " + world[n].host + " (node " + std::to_string(n) + ")";
      child.output_prefix = world[n].host + ": ";  // as pdsh prints remote lines
      child.exec_path = *program_path;
      child.argv = ssh_argv(job, static_cast<int>(n));
      child.remote_node = true;
      children.push_back(std::move(child));
    }
    RunnerOptions runner;
    runner.kill_grace_s = kill_grace_s + kRemoteStopMarginSeconds;
    runner.unit = "host";
    return run_processes(children, runner);
  }

  ChildSpec child;
  child.label = program;
  child.exec_path = *program_path;
  // mvapich's mpirun reads the hosts from a file, one a line (DeepSpeed writes
  // /tmp/deepspeed_mvapich_hostfile; this one is per launch and goes with it).
  std::string hosts_file;
  if (options.launcher == kMvapichLauncher) {
    hosts_file = "/tmp/deepspeed_mvapich_hostfile." + std::to_string(::getpid());
    std::ofstream(hosts_file) << mvapich_hosts_file_text(job);
  }
  if (options.launcher == kOpenMpiLauncher) child.argv = mpirun_argv(job);
  if (options.launcher == kMpichLauncher) child.argv = mpich_argv(job);
  if (options.launcher == kImpiLauncher) child.argv = impi_argv(job);
  if (options.launcher == kMvapichLauncher) child.argv = mvapich_argv(job, hosts_file);
  if (options.launcher == kSlurmLauncher) child.argv = srun_argv(job);
  log_info("cmd = " + shell_join(child.argv));
  RunnerOptions runner;
  runner.kill_grace_s = kill_grace_s;
  runner.unit = program;
  const int rc = run_processes({child}, runner);
  if (!hosts_file.empty()) std::remove(hosts_file.c_str());
  return rc;
}

}  // namespace deepspeed::launcher
