// Spawning, output relay, signal forwarding and failure propagation: see process_runner.h.
//
// Note [Zombie ranks]: a child's exit is observed with waitid(WNOWAIT) and the child is only reaped
// at the very end. While a child is an unreaped zombie its pid cannot be reused, so its process
// group id stays ours and signalling the group (to reach processes the child left behind, e.g.
// dataloader workers) can never hit an unrelated process.
#include "process_runner.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <memory>
#include <system_error>

#include "fd_io.h"
#include "line_prefixer.h"
#include "log.h"
#include "signal_pipe.h"
#include "text_util.h"
#include "usage_error.h"

namespace deepspeed::launcher {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::size_t kReadChunkBytes = 64 * 1024;
constexpr int kExecFailedStatus = 127;  // what shells return for "command cannot be run"
constexpr int kSshFailedStatus = 255;   // ssh's own failure (connection, authentication)

struct Stream {
  Stream(int target, const std::string& prefix) : target_fd(target), prefixer(prefix) {}
  int fd = -1;     // read end of the child's pipe; -1 once closed
  int target_fd;   // STDOUT_FILENO or STDERR_FILENO
  LinePrefixer prefixer;
  std::string* report_sink = nullptr;  // remote node stderr: where its failure report goes
};

struct Child {
  explicit Child(const ChildSpec& s) : spec(s) {
    streams.emplace_back(STDOUT_FILENO, s.output_prefix);
    streams.emplace_back(STDERR_FILENO, s.output_prefix);
    if (s.remote_node) streams[1].report_sink = &report;
  }
  const ChildSpec& spec;
  pid_t pid = -1;       // also the process group id (the child leads its own group)
  bool started = false;
  bool exited = false;  // seen via WNOWAIT; see Note [Zombie ranks]
  int exit_code = 0;    // valid when exited and term_signal == 0
  int term_signal = 0;  // signal that killed the child, 0 if it exited
  bool core_dumped = false;
  std::vector<Stream> streams;
  int log_fd = -1;
  int lifeline_fd = -1;  // write end of a remote node's stdin; see Note [Stdin lifeline]
  std::string report;    // the remote node's description of its first failed rank
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

std::string describe_status(const Child& c) {
  if (c.term_signal != 0) {
    std::string out = "was killed by signal " + std::to_string(c.term_signal) + " (" + signal_name(c.term_signal) + ")";
    if (c.core_dumped) out += " (core dumped)";
    return out;
  }
  return "exited with status " + std::to_string(c.exit_code);
}

std::string describe_exit(const Child& c) {
  if (c.spec.remote_node) {
    // "host H (node N): rank R (pid P) was killed by signal 9 (Killed)" when the host said which
    // rank failed; otherwise the ssh status, which is the per-node launcher's.
    if (!c.report.empty()) return c.spec.label + ": " + c.report + " (its launcher " + describe_status(c) + ")";
    std::string out = c.spec.label + ": " + describe_status(c);
    if (c.term_signal == 0 && c.exit_code == kSshFailedStatus) {
      out += " (ssh's own failure: the host is unreachable, refused the login, or the connection dropped)";
    }
    return out;
  }
  return c.spec.label + " (pid " + std::to_string(c.pid) + ") " + describe_status(c);
}

class Runner {
 public:
  Runner(const std::vector<ChildSpec>& specs, const RunnerOptions& options)
      : options_(options), signals_({SIGCHLD, SIGINT, SIGTERM}) {
    for (const ChildSpec& spec : specs) children_.push_back(std::make_unique<Child>(spec));
  }

  ~Runner() {
    for (auto& c : children_) {
      for (Stream& s : c->streams) close_fd(s.fd);
      close_fd(c->log_fd);
      close_fd(c->lifeline_fd);
    }
  }

  int run() {
    open_logs();
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

  void open_logs() {
    for (auto& c : children_) {
      if (c->spec.log_path.empty()) continue;
      c->log_fd = ::open(c->spec.log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (c->log_fd < 0) {
        throw UsageError("--enable_each_rank_log: cannot create " + c->spec.log_path + ": " + std::strerror(errno));
      }
    }
  }

  void spawn_all() {
    try {
      for (auto& c : children_) spawn(*c);
    } catch (...) {
      // Leave nothing behind: children already running would otherwise wait forever for peers.
      for (auto& c : children_) {
        if (c->started) ::kill(-c->pid, SIGKILL);
      }
      for (auto& c : children_) {
        if (c->started) ::waitpid(c->pid, nullptr, 0);
      }
      throw;
    }
  }

  static std::vector<std::string> build_environment(const ChildSpec& spec) {
    std::vector<std::string> env;
    for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
      std::string_view kv(*entry);
      std::string_view key = kv.substr(0, kv.find('='));
      bool overridden = std::any_of(spec.env.begin(), spec.env.end(), [&](const EnvVar& v) { return v.first == key; });
      if (!overridden) env.emplace_back(kv);
    }
    for (const EnvVar& v : spec.env) env.push_back(v.first + "=" + v.second);
    return env;
  }

  void spawn(Child& c) {
    std::vector<std::string> env = build_environment(c.spec);
    std::vector<char*> envp;
    for (auto& s : env) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::vector<std::string> args = c.spec.argv;
    std::vector<char*> argv;
    for (auto& s : args) argv.push_back(s.data());
    argv.push_back(nullptr);

    int out_pipe[2] = {-1, -1};
    int err_pipe[2] = {-1, -1};
    int in_pipe[2] = {-1, -1};
    auto close_all = [&] {
      for (int* p : {out_pipe, err_pipe, in_pipe}) {
        close_fd(p[0]);
        close_fd(p[1]);
      }
    };
    if (::pipe2(out_pipe, O_CLOEXEC) != 0 || ::pipe2(err_pipe, O_CLOEXEC) != 0 ||
        (c.spec.remote_node && ::pipe2(in_pipe, O_CLOEXEC) != 0)) {
      int error = errno;
      close_all();
      errno = error;
      throw_errno("creating the pipes for", c);
    }

    const pid_t parent = ::getpid();
    // Block signals across fork() so the child cannot run our handlers before resetting them.
    sigset_t all;
    sigset_t previous;
    sigfillset(&all);
    ::sigprocmask(SIG_BLOCK, &all, &previous);
    pid_t pid = ::fork();
    if (pid == 0) exec_child(c, in_pipe[0], out_pipe[1], err_pipe[1], parent, argv.data(), envp.data());
    int fork_errno = errno;
    ::sigprocmask(SIG_SETMASK, &previous, nullptr);
    close_fd(out_pipe[1]);
    close_fd(err_pipe[1]);
    close_fd(in_pipe[0]);
    if (pid < 0) {
      close_all();
      errno = fork_errno;
      throw_errno("fork() for", c);
    }
    // Also set here: whichever of parent and child runs first, the group exists before we might
    // signal it.
    ::setpgid(pid, pid);
    c.pid = pid;
    c.started = true;
    c.streams[0].fd = out_pipe[0];
    c.streams[1].fd = err_pipe[0];
    c.lifeline_fd = in_pipe[1];
    for (Stream& s : c.streams) ::fcntl(s.fd, F_SETFL, ::fcntl(s.fd, F_GETFL) | O_NONBLOCK);
  }

  [[noreturn]] static void throw_errno(const char* what, const Child& c) {
    throw std::system_error(errno, std::generic_category(), std::string("deepspeed: ") + what + " " + c.spec.label);
  }

  // Runs in the forked child; never returns. The launcher is single-threaded, so allocating here
  // is safe.
  [[noreturn]] void exec_child(const Child& c, int in_r, int out_w, int err_w, pid_t parent, char** argv,
                               char** envp) const {
    signals_.reset_in_child();
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::setpgid(0, 0);  // own group: a Ctrl-C at the terminal reaches only the launcher, which forwards
    // If the launcher itself is SIGKILLed the children must not live on holding GPUs and ports
    // (for an ssh child, its death closes the lifeline and the remote host stops too).
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(1);
    int stdin_fd = in_r >= 0 ? in_r : ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (stdin_fd >= 0) ::dup2(stdin_fd, STDIN_FILENO);
    ::dup2(out_w, STDOUT_FILENO);
    ::dup2(err_w, STDERR_FILENO);
    if (!c.spec.cpu_cores.empty()) {
      cpu_set_t set;
      CPU_ZERO(&set);
      for (int core : c.spec.cpu_cores) CPU_SET(core, &set);
      if (::sched_setaffinity(0, sizeof(set), &set) != 0) {
        child_fail("cannot pin to the cores of --bind_cores_to_rank", errno);
      }
    }
    ::execve(c.spec.exec_path.c_str(), argv, envp);
    child_fail("cannot execute '" + c.spec.exec_path + "'", errno);
  }

  [[noreturn]] static void child_fail(const std::string& what, int error) {
    std::string message = "deepspeed: " + what + ": " + std::strerror(error) + " (exit " +
                          std::to_string(kExecFailedStatus) + ")\n";
    write_all(STDERR_FILENO, message);
    ::_exit(kExecFailedStatus);
  }

  void loop() {
    std::vector<pollfd> pfds;
    std::vector<std::pair<Child*, Stream*>> owners;
    while (running_count() > 0) {
      pfds.clear();
      owners.clear();
      pfds.push_back({signals_.fd(), POLLIN, 0});
      const bool watch_stdin = options_.controlled_by_stdin && !stdin_closed_;
      if (watch_stdin) pfds.push_back({STDIN_FILENO, POLLIN, 0});
      const std::size_t first_stream = pfds.size();
      for (auto& c : children_) {
        for (Stream& s : c->streams) {
          if (s.fd < 0) continue;
          pfds.push_back({s.fd, POLLIN, 0});
          owners.emplace_back(c.get(), &s);
        }
      }
      int timeout_ms = -1;
      if (stopping_ && !killed_) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - Clock::now());
        timeout_ms = static_cast<int>(std::max<long long>(0, left.count() + 1));
      }
      int ready = ::poll(pfds.data(), pfds.size(), timeout_ms);
      if (ready < 0 && errno != EINTR) {
        throw std::system_error(errno, std::generic_category(), "deepspeed: poll() on child output");
      }
      if (ready > 0) {
        // Output first, so a child's last lines come before the launcher's message about its exit.
        for (std::size_t i = first_stream; i < pfds.size(); ++i) {
          if (pfds[i].revents != 0) read_once(*owners[i - first_stream].first, *owners[i - first_stream].second);
        }
        if (watch_stdin && pfds[1].revents != 0) read_lifeline();
        if (pfds[0].revents != 0) {
          for (int sig : signals_.drain()) {
            if (sig == SIGINT || sig == SIGTERM) on_stop_request(sig, "received " + signal_abbrev(sig), true);
          }
        }
      }
      // Cheap (one waitid per live child) and immune to coalesced SIGCHLDs.
      check_exits();
      if (stopping_ && !killed_ && Clock::now() >= deadline_) escalate();
    }
  }

  // Per-node mode: see Note [Stdin lifeline].
  void read_lifeline() {
    char buffer[256];
    ssize_t n = ::read(STDIN_FILENO, buffer, sizeof(buffer));
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
    if (n <= 0) {
      stdin_closed_ = true;
      on_stop_request(SIGTERM, "lost the launcher that started this host (stdin closed)", false);
      return;
    }
    lifeline_text_.append(buffer, static_cast<std::size_t>(n));
    std::size_t newline;
    while ((newline = lifeline_text_.find('\n')) != std::string::npos) {
      std::string line(trim(lifeline_text_.substr(0, newline)));
      lifeline_text_.erase(0, newline + 1);
      if (line == "SIGINT" || line == "SIGTERM") {
        on_stop_request(line == "SIGINT" ? SIGINT : SIGTERM, "the launcher that started this host asked to stop", false);
      }
    }
  }

  // Returns false once the stream is at EOF.
  bool read_once(Child& c, Stream& s) {
    char buffer[kReadChunkBytes];
    while (true) {
      ssize_t n = ::read(s.fd, buffer, sizeof(buffer));
      if (n > 0) {
        relay(c, s, std::string_view(buffer, static_cast<std::size_t>(n)));
        return true;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
      // EOF (or a read error, treated alike): the child and all its children closed this stream.
      write_out(s, s.prefixer.flush());
      close_fd(s.fd);
      return false;
    }
  }

  // Reads what is buffered now, without waiting for EOF: children of the child may still hold the
  // pipe open. Bounded, so a process that keeps writing cannot keep us here.
  void drain(Child& c) {
    constexpr int kMaxReads = 64;
    for (Stream& s : c.streams) {
      for (int i = 0; i < kMaxReads && s.fd >= 0; ++i) {
        pollfd p{s.fd, POLLIN, 0};
        if (::poll(&p, 1, 0) <= 0) break;
        if (!read_once(c, s)) break;
      }
      write_out(s, s.prefixer.flush());
    }
  }

  void relay(Child& c, Stream& s, std::string_view data) {
    if (c.log_fd >= 0) write_all(c.log_fd, data);
    write_out(s, s.prefixer.feed(data));
  }

  // Writes whole prefixed lines; a remote node's report lines are kept instead of printed.
  void write_out(const Stream& s, std::string text) {
    if (text.empty()) return;
    if (s.report_sink != nullptr) text = take_reports(s, text);
    if (text.empty()) return;
    bool& broken = s.target_fd == STDOUT_FILENO ? stdout_broken_ : stderr_broken_;
    // A reader that went away (`deepspeed ... | head`) must not stop the job; keep draining.
    if (!broken && !write_all(s.target_fd, text)) broken = true;
  }

  static std::string take_reports(const Stream& s, const std::string& lines) {
    const std::string marker = s.prefixer.prefix() + kNodeReportPrefix;
    std::string kept;
    std::size_t start = 0;
    while (start < lines.size()) {
      std::size_t end = lines.find('\n', start);
      end = end == std::string::npos ? lines.size() : end + 1;
      std::string_view line(lines.data() + start, end - start);
      if (starts_with(line, marker)) {
        if (s.report_sink->empty()) s.report_sink->assign(trim(line.substr(marker.size())));
      } else {
        kept += line;
      }
      start = end;
    }
    return kept;
  }

  void check_exits() {
    for (auto& c : children_) {
      if (!c->started || c->exited) continue;
      siginfo_t info{};
      // See Note [Zombie ranks]: WNOWAIT leaves the child unreaped.
      if (::waitid(P_PID, static_cast<id_t>(c->pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0) continue;
      if (info.si_pid == 0) continue;  // still running
      c->exited = true;
      if (info.si_code == CLD_EXITED) {
        c->exit_code = info.si_status;
      } else {
        c->term_signal = info.si_status;
        c->core_dumped = info.si_code == CLD_DUMPED;
      }
      close_fd(c->lifeline_fd);
      on_child_exit(*c);
    }
  }

  void on_child_exit(Child& c) {
    drain(c);
    bool failed = c.term_signal != 0 || c.exit_code != 0;
    if (!failed) return;
    if (stopping_) {
      log_info(describe_exit(c));
      return;
    }
    exit_code_ = c.term_signal != 0 ? 128 + c.term_signal : c.exit_code;
    int others = running_count();
    std::string message = describe_exit(c);
    // Under a controller, say which rank failed in the one line it looks for.
    if (options_.controlled_by_stdin) write_all(STDERR_FILENO, std::string(kNodeReportPrefix) + message + "\n");
    if (others > 0) message += "; stopping the other " + std::to_string(others) + " " + options_.unit + "(s)";
    log_error(message);
    if (c.term_signal == SIGKILL && !c.spec.remote_node) {
      log_info("a SIGKILL nobody sent on purpose usually comes from the out-of-memory killer; see "
               "`dmesg` or the job scheduler's log");
    }
    begin_stop(SIGTERM);
  }

  // A signal to the launcher (`is_signal`), or a stop request on the lifeline. Only a repeated
  // signal escalates: the lifeline's EOF after its stop message is expected.
  void on_stop_request(int sig, const std::string& why, bool is_signal) {
    if (!stopping_) {
      exit_code_ = 1;  // matches DeepSpeed's launch.py
      log_error(why + "; forwarding " + signal_abbrev(sig) + " to " + std::to_string(running_count()) + " " +
                options_.unit + "(s), SIGKILL in " + seconds_text() + (is_signal ? " (send it again to kill now)" : ""));
      begin_stop(sig);
    } else if (!killed_ && is_signal) {
      log_error(why + " again; sending SIGKILL");
      escalate();
    }
  }

  std::string seconds_text() const {
    char buffer[32];
    std::snprintf(buffer, sizeof(buffer), "%g s", options_.kill_grace_s);
    return buffer;
  }

  // Signals every child's group, including children already exited (see Note [Zombie ranks])
  // whose own children may still be running; remote nodes get the signal's name on their lifeline.
  void begin_stop(int sig) {
    stopping_ = true;
    stop_signal_ = sig;
    deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                   std::chrono::duration<double>(options_.kill_grace_s));
    for (auto& c : children_) {
      if (c->spec.remote_node) {
        if (c->lifeline_fd >= 0) write_all(c->lifeline_fd, signal_abbrev(sig) + "\n");
        close_fd(c->lifeline_fd);
      } else {
        signal_group(*c, sig);
      }
    }
  }

  void escalate() {
    killed_ = true;
    std::vector<std::string> still;
    for (auto& c : children_) {
      if (!c->exited) still.push_back(c->spec.label);
    }
    if (!still.empty()) {
      log_warning(join(still, ", ") + " still running " + seconds_text() + " after " + signal_abbrev(stop_signal_) +
                  "; sending SIGKILL");
    }
    for (auto& c : children_) {
      if (!c->exited) signal_group(*c, SIGKILL);
    }
  }

  static void signal_group(const Child& c, int sig) {
    if (!c.started) return;
    if (::kill(-c.pid, sig) != 0 && !c.exited) ::kill(c.pid, sig);
  }

  int running_count() const {
    return static_cast<int>(std::count_if(children_.begin(), children_.end(),
                                          [](const auto& c) { return c->started && !c->exited; }));
  }

  void finish() {
    for (auto& c : children_) drain(*c);
    if (stopping_) {
      // The job is over: whatever a child left in its group must not outlive it.
      for (auto& c : children_) signal_group(*c, SIGKILL);
      log_info("all " + options_.unit + "s stopped; exiting with status " + std::to_string(exit_code_));
    }
    for (auto& c : children_) {
      if (c->started) ::waitpid(c->pid, nullptr, 0);
    }
  }

  const RunnerOptions& options_;
  SignalPipe signals_;
  std::vector<std::unique_ptr<Child>> children_;
  bool stopping_ = false;
  bool killed_ = false;
  int stop_signal_ = SIGTERM;
  Clock::time_point deadline_{};
  int exit_code_ = 0;
  bool stdout_broken_ = false;
  bool stderr_broken_ = false;
  bool stdin_closed_ = false;
  std::string lifeline_text_;
};

}  // namespace

int run_processes(const std::vector<ChildSpec>& children, const RunnerOptions& options) {
  Runner runner(children, options);
  return runner.run();
}

}  // namespace deepspeed::launcher
