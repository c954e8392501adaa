// The launcher across real separate hosts: two network namespaces on this machine, each with its
// own address and sshd (netns_hosts.sh), stand in for two machines. The launcher runs in the first
// and starts 2 ranks on each host over ssh (--launcher pdsh) or mpirun (--launcher openmpi); the
// ranks' collectives must give the same bits as the same 4 ranks on one host. Failure paths: a
// remote rank killed, a remote host's launcher lost, and Ctrl-C at the launcher each end the job
// on both hosts within seconds. Needs root and `ip netns`; otherwise every test here skips with
// the reason (CI runs as root, so they run there). Also (no root needed): the OMPI_*/SLURM_*
// fallbacks of the rank environment.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <thread>

#include "support/test_port.h"
#include "test_process.h"

namespace deepspeed::launcher {
namespace {

using testing::ProcessResult;
using testing::TempDir;
using testing::TestProcess;
using Env = std::vector<std::pair<std::string, std::string>>;

// Reserved across the test processes that run at once (support/test_port.h).
int master_port() { return deepspeed::testing::reserve_port(); }

const Env kTestEnv = {{"DS_LAUNCHER_KILL_GRACE_S", "3"}, {"OMP_NUM_THREADS", "1"}};
constexpr double kStopWithinSeconds = 5.0;

std::string launcher() { return testing::required_env("DS_TEST_LAUNCHER"); }
std::string probe() { return testing::required_env("DS_TEST_PROBE"); }
std::string collective_probe() { return testing::required_env("DS_TEST_COLLECTIVE_PROBE"); }

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

std::string ip_binary() {
  for (const char* path : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}) {
    if (::access(path, X_OK) == 0) return path;
  }
  return "ip";
}

// The two hosts, up for the whole suite: netns_hosts.sh serve holds them until its stdin closes.
struct Hosts {
  std::string skip_reason;  // non-empty: the tests skip, saying this
  std::string host_a, host_b, ns_a, ns_b, ssh_config, if_a, if_b;
  std::unique_ptr<TempDir> work;
  std::unique_ptr<TestProcess> server;
};

Hosts* g_hosts = nullptr;

std::map<std::string, std::string> parse_fields(const std::string& line) {
  std::map<std::string, std::string> fields;
  std::istringstream words(line);
  std::string word;
  while (words >> word) {
    std::size_t eq = word.find('=');
    if (eq != std::string::npos) fields[word.substr(0, eq)] = word.substr(eq + 1);
  }
  return fields;
}

void start_hosts() {
  g_hosts = new Hosts;
  const std::string script = testing::required_env("DS_TEST_NETNS_HOSTS");
  ProcessResult check = testing::run_process({"/bin/bash", script, "check"}, {}, 30);
  if (check.exit_code != 0) {
    g_hosts->skip_reason = "multi-host tests need root and network namespaces: " + check.out + check.err;
    std::fprintf(stderr, "\n*** MULTI-HOST TESTS SKIPPED: %s\n", g_hosts->skip_reason.c_str());
    return;
  }
  g_hosts->work = std::make_unique<TempDir>();
  g_hosts->server = std::make_unique<TestProcess>(std::vector<std::string>{"/bin/bash", script, "serve", g_hosts->work->path()},
                                                  Env{}, std::vector<std::string>{}, std::string{}, /*pipe_stdin=*/true);
  if (!g_hosts->server->wait_for_stdout("READY ", 1, 60)) {
    ADD_FAILURE() << "netns_hosts.sh did not come up:\n" << g_hosts->server->stdout_text() << g_hosts->server->stderr_text();
    g_hosts->skip_reason = "setup failed (see the failure above)";
    return;
  }
  std::string out = g_hosts->server->stdout_text();
  auto f = parse_fields(out.substr(out.find("READY ")));
  g_hosts->host_a = f["host_a"];
  g_hosts->host_b = f["host_b"];
  g_hosts->ns_a = f["ns_a"];
  g_hosts->ns_b = f["ns_b"];
  g_hosts->ssh_config = f["ssh_config"];
  g_hosts->if_a = f["if_a"];
  g_hosts->if_b = f["if_b"];
}

void stop_hosts() {
  if (g_hosts == nullptr) return;
  if (g_hosts->server) {
    g_hosts->server->close_stdin();  // the script tears down namespaces and sshd on EOF
    ProcessResult r = g_hosts->server->wait(60);
    EXPECT_EQ(r.exit_code, 0) << r.err;
  }
  delete g_hosts;
  g_hosts = nullptr;
}

class MultiHost : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { start_hosts(); }
  static void TearDownTestSuite() { stop_hosts(); }

  void SetUp() override {
    if (!g_hosts->skip_reason.empty()) GTEST_SKIP() << g_hosts->skip_reason;
    hosts_ = g_hosts;
    write(dir_.path() + "/hosts", "# two hosts, two slots each\n" + hosts_->host_a + " slots=2\n" + hosts_->host_b + " slots=2\n");
  }

  static void write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

  // `deepspeed ARGS` started inside host A's namespace, in the job directory.
  std::vector<std::string> on_host_a(const std::vector<std::string>& args) const {
    std::vector<std::string> argv = {ip_binary(), "netns", "exec", hosts_->ns_a, launcher()};
    argv.insert(argv.end(), args.begin(), args.end());
    return argv;
  }

  std::string ssh_args() const { return "-F " + hosts_->ssh_config; }

  std::string namespace_id(const std::string& ns) const {
    ProcessResult r = testing::run_process({ip_binary(), "netns", "exec", ns, "/usr/bin/readlink", "/proc/self/ns/net"}, {}, 10);
    return std::string(r.out.substr(0, r.out.find('\n')));
  }

  Hosts* hosts_ = nullptr;
  TempDir dir_;
};

// "rank=R <rest>" lines of the collective probe, keyed by rank, whatever prefix the launcher added.
std::map<int, std::vector<std::string>> probe_lines(const std::string& out) {
  std::map<int, std::vector<std::string>> lines;
  static const std::regex line_re(R"(rank=(\d+) (.*))");
  for (const std::string& line : testing::split_lines(out)) {
    std::smatch m;
    if (std::regex_search(line, m, line_re)) lines[std::stoi(m[1])].push_back(m[2]);
  }
  return lines;
}

std::string line_starting(const std::vector<std::string>& lines, const std::string& start) {
  for (const std::string& line : lines) {
    if (line.rfind(start, 0) == 0) return line;
  }
  return "";
}

// The same 4 ranks on this one machine: the reference the multi-host runs must equal.
std::map<int, std::vector<std::string>> single_host_reference() {
  static std::map<int, std::vector<std::string>> reference = [] {
    ProcessResult r = testing::run_process({launcher(), "-q", "--num_gpus", "4", "--master_port",
                                            std::to_string(master_port()), collective_probe()},
                                           kTestEnv, 120);
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    return probe_lines(r.out);
  }();
  return reference;
}

void expect_same_results(const std::map<int, std::vector<std::string>>& got, const std::string& run_text) {
  auto reference = single_host_reference();
  for (int rank = 0; rank < 4; ++rank) {
    const std::string want = line_starting(reference[rank], "result ");
    ASSERT_FALSE(want.empty()) << "single-host run gave no result for rank " << rank;
    EXPECT_EQ(line_starting(got.at(rank), "result "), want) << "rank " << rank << "\n" << run_text;
    EXPECT_EQ(line_starting(got.at(rank), "all_reduce "), "all_reduce ok") << run_text;
  }
}

TEST_F(MultiHost, SshFanOut_TwoHostsGiveTheSingleHostResult) {
  write(dir_.path() + "/.deepspeed_env", "DS_MH_FROM_FILE = from the env file\n");
  Env env = kTestEnv;
  env.emplace_back("NCCL_MH_TEST", "from-env");
  ProcessResult r = testing::run_process(
      on_host_a({"--hostfile", "hosts", "--launcher_args", ssh_args(), "--master_port", std::to_string(master_port()),
                 collective_probe(), "--steps=5"}),
      env, 120, dir_.path());
  const std::string text = r.out + r.err;
  ASSERT_EQ(r.exit_code, 0) << text;
  auto lines = probe_lines(r.out);
  ASSERT_EQ(lines.size(), 4u) << text;
  expect_same_results(lines, text);

  const std::string ns_a = namespace_id(hosts_->ns_a);
  const std::string ns_b = namespace_id(hosts_->ns_b);
  ASSERT_NE(ns_a, ns_b);
  for (int rank = 0; rank < 4; ++rank) {
    const auto& mine = lines[rank];
    const bool on_a = rank < 2;
    const std::string local = std::to_string(rank % 2);
    EXPECT_EQ(line_starting(mine, "where "), "where world=4 local_rank=" + local + " local_world=2 netns=" + (on_a ? ns_a : ns_b))
        << "rank " << rank << " ran on the wrong host\n" << text;
    EXPECT_EQ(line_starting(mine, "env RANK="), "env RANK=" + std::to_string(rank));
    EXPECT_EQ(line_starting(mine, "env LOCAL_RANK="), "env LOCAL_RANK=" + local);
    EXPECT_EQ(line_starting(mine, "env WORLD_SIZE="), "env WORLD_SIZE=4");
    EXPECT_EQ(line_starting(mine, "env LOCAL_WORLD_SIZE="), "env LOCAL_WORLD_SIZE=2");
    EXPECT_EQ(line_starting(mine, "env CROSS_RANK="), std::string("env CROSS_RANK=") + (on_a ? "0" : "1"));
    EXPECT_EQ(line_starting(mine, "env CROSS_SIZE="), "env CROSS_SIZE=2");
    EXPECT_EQ(line_starting(mine, "env MASTER_ADDR="), "env MASTER_ADDR=" + hosts_->host_a)
        << "the default master is the first host's `hostname -I`";
    EXPECT_EQ(line_starting(mine, "env NCCL_MH_TEST="), "env NCCL_MH_TEST=from-env") << "NCCL* is exported";
    EXPECT_EQ(line_starting(mine, "env DS_MH_FROM_FILE="), "env DS_MH_FROM_FILE=from the env file");
  }
  // Each host's local rank 0 names the interface Gloo bound to: the one that routes to MASTER_ADDR.
  EXPECT_TRUE(contains(r.out, hosts_->host_b + ": [rank 2] [deepspeed] [rank 2/4] Gloo uses interface " + hosts_->if_b +
                                  " (" + hosts_->host_b + "), the route to MASTER_ADDR=" + hosts_->host_a))
      << r.out;
  EXPECT_TRUE(contains(r.out, "Gloo uses interface " + hosts_->if_a + " (" + hosts_->host_a + ")")) << r.out;
}

TEST_F(MultiHost, OpenMpi_TwoHostsGiveTheSingleHostResult) {
  if (::access("/usr/bin/mpirun", X_OK) != 0) GTEST_SKIP() << "mpirun not installed (Debian: openmpi-bin)";
  const std::string subnet = hosts_->host_a.substr(0, hosts_->host_a.rfind('.')) + ".0/24";
  ProcessResult r = testing::run_process(
      on_host_a({"--hostfile", "hosts", "--launcher", "openmpi", "--master_addr", hosts_->host_a, "--master_port",
                 std::to_string(master_port()), "--no_ssh_check", "--launcher_args",
                 "--allow-run-as-root --mca plm_rsh_args '" + ssh_args() + "' --mca btl_tcp_if_include " + subnet +
                     " --mca oob_tcp_if_include " + subnet,
                 collective_probe(), "--steps=5"}),
      kTestEnv, 120, dir_.path());
  const std::string text = r.out + r.err;
  ASSERT_EQ(r.exit_code, 0) << text;
  EXPECT_TRUE(contains(r.err, "cmd = mpirun -n 4 -hostfile hosts --mca btl '^openib' --allow-run-as-root")) << r.err;
  auto lines = probe_lines(r.out);
  ASSERT_EQ(lines.size(), 4u) << text;
  expect_same_results(lines, text);
  const std::string ns_b = namespace_id(hosts_->ns_b);
  for (int rank = 0; rank < 4; ++rank) {
    // Ranks came from OMPI_COMM_WORLD_* (no RANK set): see Note [Launcher variables] in env.h.
    EXPECT_EQ(line_starting(lines[rank], "env RANK="), "env RANK=<unset>");
    const std::string where = line_starting(lines[rank], "where ");
    EXPECT_TRUE(contains(where, "world=4 local_rank=" + std::to_string(rank % 2) + " local_world=2")) << where;
    EXPECT_EQ(contains(where, ns_b), rank >= 2) << "mpirun maps ranks by slot in hostfile order: " << where;
  }
}

std::vector<pid_t> read_pids(const std::string& dir) {
  std::vector<pid_t> pids;
  for (int rank = 0; rank < 4; ++rank) {
    std::string text = testing::read_file(dir + "/rank" + std::to_string(rank) + ".pid");
    pids.push_back(text.empty() ? -1 : static_cast<pid_t>(std::stoi(text)));
  }
  return pids;
}

// Starts 4 sleeping ranks (launcher_probe) across both hosts and waits until all have written
// their pid files.
std::unique_ptr<TestProcess> start_sleepers(const std::vector<std::string>& args, const std::string& job_dir,
                                            const std::string& pid_dir) {
  auto p = std::make_unique<TestProcess>(args, kTestEnv, std::vector<std::string>{}, job_dir);
  auto all_up = [&] {
    for (pid_t pid : read_pids(pid_dir)) {
      if (pid <= 0) return false;
    }
    return true;
  };
  for (int i = 0; i < 300 && !all_up(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  return p;
}

void expect_all_gone(const std::vector<pid_t>& pids) {
  for (std::size_t rank = 0; rank < pids.size(); ++rank) {
    ASSERT_GT(pids[rank], 0) << "rank " << rank << " never started";
    bool gone = false;
    for (int i = 0; i < 50 && !gone; ++i) {
      gone = !testing::process_alive(pids[rank]);
      if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    EXPECT_TRUE(gone) << "rank " << rank << " (pid " << pids[rank] << ") still runs";
  }
}

TEST_F(MultiHost, RemoteRankKilled_EndsTheJobOnBothHostsNamingIt) {
  TempDir pids;
  auto p = start_sleepers(on_host_a({"--hostfile", "hosts", "--launcher_args", ssh_args(), "--master_port",
                                     std::to_string(master_port()), probe(), "--pid_dir=*:" + pids.path(), "--sleep_s=*:120"}),
                          dir_.path(), pids.path());
  std::vector<pid_t> ranks = read_pids(pids.path());
  ASSERT_GT(ranks[3], 0) << p->stderr_text();
  const double killed = testing::monotonic_seconds();
  ASSERT_EQ(::kill(ranks[3], SIGKILL), 0);
  ProcessResult r = p->wait(60);
  EXPECT_LT(testing::monotonic_seconds() - killed, kStopWithinSeconds) << r.err;
  EXPECT_EQ(r.exit_code, 128 + SIGKILL) << r.err;
  const std::regex report("deepspeed: host " + hosts_->host_b + R"( \(node 1\): rank 3 \(pid \d+\) )" +
                          R"(was killed by signal 9 \(Killed\) .*stopping the other 1 host\(s\))");
  EXPECT_TRUE(std::regex_search(r.err, report)) << r.err;
  expect_all_gone(ranks);
}

TEST_F(MultiHost, RemoteHostLost_EndsTheJobOnBothHosts) {
  TempDir pids;
  auto p = start_sleepers(on_host_a({"--hostfile", "hosts", "--launcher_args", ssh_args(), "--master_port",
                                     std::to_string(master_port()), probe(), "--pid_dir=*:" + pids.path(), "--sleep_s=*:120"}),
                          dir_.path(), pids.path());
  std::vector<pid_t> ranks = read_pids(pids.path());
  ASSERT_GT(ranks[2], 0) << p->stderr_text();
  // Host B's per-node launcher is rank 2's parent; SIGKILL it as if the machine went away.
  std::string stat = testing::read_file("/proc/" + std::to_string(ranks[2]) + "/stat");
  pid_t node_launcher = 0;
  std::sscanf(stat.c_str() + stat.rfind(')') + 2, "%*c %d", &node_launcher);
  ASSERT_GT(node_launcher, 1) << stat;
  const double killed = testing::monotonic_seconds();
  ASSERT_EQ(::kill(node_launcher, SIGKILL), 0);
  ProcessResult r = p->wait(60);
  EXPECT_LT(testing::monotonic_seconds() - killed, kStopWithinSeconds) << r.err;
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.err, "deepspeed: host " + hosts_->host_b + " (node 1): exited with status 255")) << r.err;
  expect_all_gone(ranks);
}

TEST_F(MultiHost, Sigint_StopsEveryRankOnEveryHost) {
  TempDir pids;
  auto p = start_sleepers(on_host_a({"--hostfile", "hosts", "--launcher_args", ssh_args(), "--master_port",
                                     std::to_string(master_port()), probe(), "--pid_dir=*:" + pids.path(), "--sleep_s=*:120"}),
                          dir_.path(), pids.path());
  std::vector<pid_t> ranks = read_pids(pids.path());
  ASSERT_GT(ranks[3], 0) << p->stderr_text();
  const double sent = testing::monotonic_seconds();
  ASSERT_EQ(::kill(p->pid(), SIGINT), 0);
  ProcessResult r = p->wait(60);
  EXPECT_LT(testing::monotonic_seconds() - sent, kStopWithinSeconds) << r.err;
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_TRUE(contains(r.err, "received SIGINT; forwarding SIGINT to 2 host(s)")) << r.err;
  for (const std::string& host : {hosts_->host_a, hosts_->host_b}) {
    EXPECT_TRUE(contains(r.err, host + ": deepspeed: the launcher that started this host asked to stop; forwarding SIGINT"))
        << r.err;
  }
  expect_all_gone(ranks);
}

// Two ranks started by hand with only a launcher's own variables: the library must place them.
std::vector<ProcessResult> run_two_ranks(const std::vector<Env>& per_rank) {
  std::vector<std::unique_ptr<TestProcess>> ranks;
  for (const Env& env : per_rank) {
    Env full = env;
    full.emplace_back("OMP_NUM_THREADS", "1");
    ranks.push_back(std::make_unique<TestProcess>(std::vector<std::string>{collective_probe(), "--steps=1"}, full,
                                                  std::vector<std::string>{"RANK", "LOCAL_RANK", "WORLD_SIZE",
                                                                           "LOCAL_WORLD_SIZE", "LOCAL_SIZE"}));
  }
  std::vector<ProcessResult> results;
  for (auto& r : ranks) results.push_back(r->wait(60));
  return results;
}

TEST(LauncherVariables, OpenMpiRanksComeFromOmpiCommWorld) {
  const std::string port = std::to_string(master_port());
  std::vector<Env> env;
  for (int r = 0; r < 2; ++r) {
    env.push_back({{"OMPI_COMM_WORLD_RANK", std::to_string(r)}, {"OMPI_COMM_WORLD_LOCAL_RANK", std::to_string(r)},
                   {"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"},
                   {"MASTER_PORT", port}});
  }
  auto results = run_two_ranks(env);
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(results[r].exit_code, 0) << results[r].out << results[r].err;
    EXPECT_TRUE(contains(results[r].out, "rank=" + std::to_string(r) + " where world=2 local_rank=" + std::to_string(r) +
                                             " local_world=2"))
        << results[r].out;
  }
}

TEST(LauncherVariables, SlurmRanksComeFromTheSrunStep) {
  const std::string port = std::to_string(master_port());
  std::vector<Env> env;
  for (int r = 0; r < 2; ++r) {
    env.push_back({{"SLURM_PROCID", std::to_string(r)}, {"SLURM_LOCALID", std::to_string(r)},
                   {"SLURM_STEP_NUM_TASKS", "2"}, {"SLURM_NTASKS", "2"}, {"SLURM_NODEID", "0"},
                   {"SLURM_STEP_TASKS_PER_NODE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", port}});
  }
  auto results = run_two_ranks(env);
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(results[r].exit_code, 0) << results[r].out << results[r].err;
    EXPECT_TRUE(contains(results[r].out, "rank=" + std::to_string(r) + " where world=2 local_rank=" + std::to_string(r) +
                                             " local_world=2"))
        << results[r].out;
  }
}

// What MPICH's and Intel MPI's mpirun (Hydra) set, and MVAPICH's.
TEST(LauncherVariables, HydraAndMvapichRanksComeFromTheirVariables) {
  for (const std::string mpi : {"hydra", "mvapich"}) {
    SCOPED_TRACE(mpi);
    const std::string port = std::to_string(master_port());
    std::vector<Env> env;
    for (int r = 0; r < 2; ++r) {
      const std::string rank = std::to_string(r);
      if (mpi == "hydra") {
        env.push_back({{"PMI_RANK", rank}, {"MPI_LOCALRANKID", rank}, {"PMI_SIZE", "2"},
                       {"MPI_LOCALNRANKS", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", port}});
      } else {
        env.push_back({{"MV2_COMM_WORLD_RANK", rank}, {"MV2_COMM_WORLD_LOCAL_RANK", rank},
                       {"MV2_COMM_WORLD_SIZE", "2"}, {"MV2_COMM_WORLD_LOCAL_SIZE", "2"},
                       {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", port}});
      }
    }
    auto results = run_two_ranks(env);
    for (int r = 0; r < 2; ++r) {
      ASSERT_EQ(results[r].exit_code, 0) << results[r].out << results[r].err;
      EXPECT_TRUE(contains(results[r].out, "rank=" + std::to_string(r) + " where world=2 local_rank=" +
                                               std::to_string(r) + " local_world=2"))
          << results[r].out;
    }
  }
}

TEST(LauncherVariables, SlurmBatchScriptAloneIsASingleProcess) {
  // A batch script has SLURM_PROCID=0 and SLURM_NTASKS=4 but is no srun step: no peers to wait for.
  ProcessResult r = testing::run_process({collective_probe(), "--steps=1"},
                                         {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "0"},
                                          {"OMP_NUM_THREADS", "1"}},
                                         60);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "rank=0 where world=1 ")) << r.out;
}

}  // namespace
}  // namespace deepspeed::launcher
