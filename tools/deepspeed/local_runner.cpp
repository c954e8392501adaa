// Spawning, output relay, signal forwarding and failure propagation: see local_runner.h.
//
// Note [Zombie ranks]: a rank's exit is observed with waitid(WNOWAIT) and the rank is only reaped
// at the very end. While a rank is an unreaped zombie its pid cannot be reused, so its process
// group id stays ours and signalling the group (to reach children the rank left behind, e.g.
// dataloader workers) can never hit an unrelated process.
#include "local_runner.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <memory>
#include <system_error>

#include "fd_io.h"
#include "line_prefixer.h"
#include "log.h"
#include "signal_pipe.h"
#include "usage_error.h"

extern char** environ;

namespace deepspeed::launcher {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::size_t kReadChunkBytes = 64 * 1024;
constexpr int kExecFailedStatus = 127;  // what shells return for "command cannot be run"

struct Stream {
  Stream(int target, const std::string& prefix) : target_fd(target), prefixer(prefix) {}
  int fd = -1;     // read end of the rank's pipe; -1 once closed
  int target_fd;   // STDOUT_FILENO or STDERR_FILENO
  LinePrefixer prefixer;
};

struct RankProcess {
  explicit RankProcess(const RankLaunch& l) : launch(l) {
    streams.emplace_back(STDOUT_FILENO, rank_prefix(l.rank));
    streams.emplace_back(STDERR_FILENO, rank_prefix(l.rank));
  }
  const RankLaunch& launch;
  pid_t pid = -1;       // also the process group id (the rank leads its own group)
  bool started = false;
  bool exited = false;  // seen via WNOWAIT; see Note [Zombie ranks]
  int exit_code = 0;    // valid when exited and term_signal == 0
  int term_signal = 0;  // signal that killed the rank, 0 if it exited
  bool core_dumped = false;
  std::vector<Stream> streams;
  int log_fd = -1;
};

std::string signal_name(int sig) {
  const char* text = ::strsignal(sig);
  return text != nullptr ? text : "unknown signal";
}

std::string signal_abbrev(int sig) {
  switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGKILL: return "SIGKILL";
    default: return "signal " + std::to_string(sig);
  }
}

std::string describe_exit(const RankProcess& r) {
  std::string out = "rank " + std::to_string(r.launch.rank) + " (pid " + std::to_string(r.pid) + ") ";
  if (r.term_signal != 0) {
    out += "was killed by signal " + std::to_string(r.term_signal) + " (" + signal_name(r.term_signal) + ")";
    if (r.core_dumped) out += " (core dumped)";
  } else {
    out += "exited with status " + std::to_string(r.exit_code);
  }
  return out;
}

void make_directories(const std::string& dir) {
  std::string partial;
  std::size_t pos = 0;
  while (pos != std::string::npos) {
    pos = dir.find('/', pos + 1);
    partial = dir.substr(0, pos);
    if (partial.empty()) continue;
    if (::mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST) {
      throw UsageError("--enable_each_rank_log " + dir + ": cannot create " + partial + ": " +
                       std::strerror(errno));
    }
  }
}

std::string timestamp_now() {
  std::time_t now = std::time(nullptr);
  std::tm local{};
  ::localtime_r(&now, &local);
  char buffer[32];
  std::strftime(buffer, sizeof(buffer), "%Y%m%d%H%M%S", &local);  // DeepSpeed's log name prefix
  return buffer;
}

class Runner {
 public:
  Runner(const LaunchPlan& plan, const RunnerOptions& options)
      : plan_(plan), options_(options), signals_({SIGCHLD, SIGINT, SIGTERM}) {
    for (const RankLaunch& launch : plan_.ranks) ranks_.push_back(std::make_unique<RankProcess>(launch));
  }

  ~Runner() {
    for (auto& r : ranks_) {
      for (Stream& s : r->streams) close_fd(s.fd);
      close_fd(r->log_fd);
    }
  }

  int run() {
    open_rank_logs();
    spawn_all();
    loop();
    finish();
    return exit_code_;
  }

 private:
  static void close_fd(int& fd) {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }

  void open_rank_logs() {
    if (options_.each_rank_log_dir.empty()) return;
    make_directories(options_.each_rank_log_dir);
    std::string stamp = timestamp_now();
    for (auto& r : ranks_) {
      std::string path = options_.each_rank_log_dir + "/" + stamp + "_rank" + std::to_string(r->launch.rank) + ".log";
      r->log_fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (r->log_fd < 0) {
        throw UsageError("--enable_each_rank_log: cannot create " + path + ": " + std::strerror(errno));
      }
    }
  }

  void spawn_all() {
    try {
      for (auto& r : ranks_) spawn(*r);
    } catch (...) {
      // Leave nothing behind: ranks already running would otherwise wait forever for peers.
      for (auto& r : ranks_) {
        if (r->started) ::kill(-r->pid, SIGKILL);
      }
      for (auto& r : ranks_) {
        if (r->started) ::waitpid(r->pid, nullptr, 0);
      }
      throw;
    }
  }

  std::vector<std::string> build_environment(const RankLaunch& launch) const {
    std::vector<std::string> env;
    for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
      std::string_view kv(*entry);
      std::string_view key = kv.substr(0, kv.find('='));
      bool overridden = std::any_of(launch.env.begin(), launch.env.end(),
                                    [&](const EnvVar& v) { return v.first == key; });
      if (!overridden) env.emplace_back(kv);
    }
    for (const EnvVar& v : launch.env) env.push_back(v.first + "=" + v.second);
    return env;
  }

  void spawn(RankProcess& r) {
    std::vector<std::string> env = build_environment(r.launch);
    std::vector<char*> envp;
    for (auto& s : env) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::vector<std::string> args = r.launch.argv;
    std::vector<char*> argv;
    for (auto& s : args) argv.push_back(s.data());
    argv.push_back(nullptr);

    int out_pipe[2];
    int err_pipe[2];
    if (::pipe2(out_pipe, O_CLOEXEC) != 0) throw_errno("creating the stdout pipe for rank", r);
    if (::pipe2(err_pipe, O_CLOEXEC) != 0) {
      ::close(out_pipe[0]);
      ::close(out_pipe[1]);
      throw_errno("creating the stderr pipe for rank", r);
    }

    const pid_t parent = ::getpid();
    // Block signals across fork() so the child cannot run our handlers before resetting them.
    sigset_t all;
    sigset_t previous;
    sigfillset(&all);
    ::sigprocmask(SIG_BLOCK, &all, &previous);
    pid_t pid = ::fork();
    if (pid == 0) exec_child(r, out_pipe[1], err_pipe[1], parent, argv.data(), envp.data());
    int fork_errno = errno;
    ::sigprocmask(SIG_SETMASK, &previous, nullptr);
    ::close(out_pipe[1]);
    ::close(err_pipe[1]);
    if (pid < 0) {
      ::close(out_pipe[0]);
      ::close(err_pipe[0]);
      errno = fork_errno;
      throw_errno("fork() for rank", r);
    }
    // Also set here: whichever of parent and child runs first, the group exists before we might
    // signal it.
    ::setpgid(pid, pid);
    r.pid = pid;
    r.started = true;
    r.streams[0].fd = out_pipe[0];
    r.streams[1].fd = err_pipe[0];
    for (Stream& s : r.streams) ::fcntl(s.fd, F_SETFL, ::fcntl(s.fd, F_GETFL) | O_NONBLOCK);
  }

  [[noreturn]] static void throw_errno(const char* what, const RankProcess& r) {
    throw std::system_error(errno, std::generic_category(),
                            std::string("deepspeed: ") + what + " " + std::to_string(r.launch.rank));
  }

  // Runs in the forked child; never returns. The launcher is single-threaded, so allocating here
  // is safe.
  [[noreturn]] void exec_child(const RankProcess& r, int out_w, int err_w, pid_t parent, char** argv,
                               char** envp) const {
    signals_.reset_in_child();
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::setpgid(0, 0);  // own group: a Ctrl-C at the terminal reaches only the launcher, which forwards
    // If the launcher itself is SIGKILLed the ranks must not live on holding GPUs and ports.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(1);
    int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (devnull >= 0) ::dup2(devnull, STDIN_FILENO);
    ::dup2(out_w, STDOUT_FILENO);
    ::dup2(err_w, STDERR_FILENO);
    if (!r.launch.cpu_cores.empty()) {
      cpu_set_t set;
      CPU_ZERO(&set);
      for (int core : r.launch.cpu_cores) CPU_SET(core, &set);
      if (::sched_setaffinity(0, sizeof(set), &set) != 0) {
        child_fail("cannot pin to the cores of --bind_cores_to_rank", errno);
      }
    }
    ::execve(plan_.program_path.c_str(), argv, envp);
    child_fail(("cannot execute '" + plan_.program_path + "'").c_str(), errno);
  }

  [[noreturn]] static void child_fail(const std::string& what, int error) {
    std::string message = "deepspeed: " + what + ": " + std::strerror(error) + " (exit " +
                          std::to_string(kExecFailedStatus) + ")\n";
    write_all(STDERR_FILENO, message);
    ::_exit(kExecFailedStatus);
  }

  void loop() {
    std::vector<pollfd> pfds;
    std::vector<std::pair<RankProcess*, Stream*>> owners;
    while (running_count() > 0) {
      pfds.clear();
      owners.clear();
      pfds.push_back({signals_.fd(), POLLIN, 0});
      for (auto& r : ranks_) {
        for (Stream& s : r->streams) {
          if (s.fd < 0) continue;
          pfds.push_back({s.fd, POLLIN, 0});
          owners.emplace_back(r.get(), &s);
        }
      }
      int timeout_ms = -1;
      if (stopping_ && !killed_) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - Clock::now());
        timeout_ms = static_cast<int>(std::max<long long>(0, left.count() + 1));
      }
      int ready = ::poll(pfds.data(), pfds.size(), timeout_ms);
      if (ready < 0 && errno != EINTR) {
        throw std::system_error(errno, std::generic_category(), "deepspeed: poll() on rank output");
      }
      if (ready > 0) {
        // Output first, so a rank's last lines come before the launcher's message about its exit.
        for (std::size_t i = 1; i < pfds.size(); ++i) {
          if (pfds[i].revents != 0) read_once(*owners[i - 1].first, *owners[i - 1].second);
        }
        if (pfds[0].revents != 0) {
          for (int sig : signals_.drain()) {
            if (sig == SIGINT || sig == SIGTERM) on_launcher_signal(sig);
          }
        }
      }
      // Cheap (one waitid per live rank) and immune to coalesced SIGCHLDs.
      check_exits();
      if (stopping_ && !killed_ && Clock::now() >= deadline_) escalate();
    }
  }

  // Returns false once the stream is at EOF.
  bool read_once(RankProcess& r, Stream& s) {
    char buffer[kReadChunkBytes];
    while (true) {
      ssize_t n = ::read(s.fd, buffer, sizeof(buffer));
      if (n > 0) {
        relay(r, s, std::string_view(buffer, static_cast<std::size_t>(n)));
        return true;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
      // EOF (or a read error, treated alike): the rank and all its children closed this stream.
      write_out(s, s.prefixer.flush());
      close_fd(s.fd);
      return false;
    }
  }

  // Reads what is buffered now, without waiting for EOF: children of the rank may still hold the
  // pipe open. Bounded, so a child that keeps writing cannot keep us here.
  void drain(RankProcess& r) {
    constexpr int kMaxReads = 64;
    for (Stream& s : r.streams) {
      for (int i = 0; i < kMaxReads && s.fd >= 0; ++i) {
        pollfd p{s.fd, POLLIN, 0};
        if (::poll(&p, 1, 0) <= 0) break;
        if (!read_once(r, s)) break;
      }
      write_out(s, s.prefixer.flush());
    }
  }

  void relay(RankProcess& r, Stream& s, std::string_view data) {
    if (r.log_fd >= 0) write_all(r.log_fd, data);
    write_out(s, s.prefixer.feed(data));
  }

  void write_out(const Stream& s, const std::string& text) {
    if (text.empty()) return;
    bool& broken = s.target_fd == STDOUT_FILENO ? stdout_broken_ : stderr_broken_;
    // A reader that went away (`deepspeed ... | head`) must not stop the job; keep draining.
    if (!broken && !write_all(s.target_fd, text)) broken = true;
  }

  void check_exits() {
    for (auto& r : ranks_) {
      if (!r->started || r->exited) continue;
      siginfo_t info{};
      // See Note [Zombie ranks]: WNOWAIT leaves the rank unreaped.
      if (::waitid(P_PID, static_cast<id_t>(r->pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0) continue;
      if (info.si_pid == 0) continue;  // still running
      r->exited = true;
      if (info.si_code == CLD_EXITED) {
        r->exit_code = info.si_status;
      } else {
        r->term_signal = info.si_status;
        r->core_dumped = info.si_code == CLD_DUMPED;
      }
      on_rank_exit(*r);
    }
  }

  void on_rank_exit(RankProcess& r) {
    drain(r);
    bool failed = r.term_signal != 0 || r.exit_code != 0;
    if (!failed) return;
    if (stopping_) {
      log_info(describe_exit(r));
      return;
    }
    exit_code_ = r.term_signal != 0 ? 128 + r.term_signal : r.exit_code;
    int others = running_count();
    std::string message = describe_exit(r);
    if (others > 0) message += "; stopping the other " + std::to_string(others) + " rank(s)";
    log_error(message);
    if (r.term_signal == SIGKILL) {
      log_info("a SIGKILL nobody sent on purpose usually comes from the out-of-memory killer; see "
               "`dmesg` or the job scheduler's log");
    }
    begin_stop(SIGTERM);
  }

  void on_launcher_signal(int sig) {
    if (!stopping_) {
      exit_code_ = 1;  // matches DeepSpeed's launch.py
      log_error("received " + signal_abbrev(sig) + "; forwarding it to " + std::to_string(running_count()) +
                " rank(s), SIGKILL in " + seconds_text() + " (send it again to kill now)");
      begin_stop(sig);
    } else if (!killed_) {
      log_error("received " + signal_abbrev(sig) + " again; sending SIGKILL");
      escalate();
    }
  }

  std::string seconds_text() const {
    char buffer[32];
    std::snprintf(buffer, sizeof(buffer), "%g s", options_.kill_grace_s);
    return buffer;
  }

  // Signals every rank's group, including ranks already exited (see Note [Zombie ranks]) whose
  // children may still be running.
  void begin_stop(int sig) {
    stopping_ = true;
    stop_signal_ = sig;
    deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                   std::chrono::duration<double>(options_.kill_grace_s));
    for (auto& r : ranks_) signal_group(*r, sig);
  }

  void escalate() {
    killed_ = true;
    std::string still;
    for (auto& r : ranks_) {
      if (r->exited) continue;
      if (!still.empty()) still += ", ";
      still += std::to_string(r->launch.rank);
    }
    if (!still.empty()) {
      log_warning("rank(s) " + still + " still running " + seconds_text() + " after " +
                  signal_abbrev(stop_signal_) + "; sending SIGKILL");
    }
    for (auto& r : ranks_) {
      if (!r->exited) signal_group(*r, SIGKILL);
    }
  }

  static void signal_group(const RankProcess& r, int sig) {
    if (!r.started) return;
    if (::kill(-r.pid, sig) != 0 && !r.exited) ::kill(r.pid, sig);
  }

  int running_count() const {
    return static_cast<int>(std::count_if(ranks_.begin(), ranks_.end(),
                                          [](const auto& r) { return r->started && !r->exited; }));
  }

  void finish() {
    for (auto& r : ranks_) drain(*r);
    if (stopping_) {
      // The job is over: children a rank left in its group must not outlive it.
      for (auto& r : ranks_) signal_group(*r, SIGKILL);
      log_info("all ranks stopped; exiting with status " + std::to_string(exit_code_));
    }
    for (auto& r : ranks_) {
      if (r->started) ::waitpid(r->pid, nullptr, 0);
    }
  }

  const LaunchPlan& plan_;
  const RunnerOptions& options_;
  SignalPipe signals_;
  std::vector<std::unique_ptr<RankProcess>> ranks_;
  bool stopping_ = false;
  bool killed_ = false;
  int stop_signal_ = SIGTERM;
  Clock::time_point deadline_{};
  int exit_code_ = 0;
  bool stdout_broken_ = false;
  bool stderr_broken_ = false;
};

}  // namespace

int run_local(const LaunchPlan& plan, const RunnerOptions& options) {
  Runner runner(plan, options);
  return runner.run();
}

}  // namespace deepspeed::launcher
