// Machine and environment probing for the launcher: see host_info.h.
#include "host_info.h"

#include <dirent.h>
#include <limits.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "usage_error.h"

namespace deepspeed::launcher {
namespace {

constexpr const char* kKillGraceEnv = "DS_LAUNCHER_KILL_GRACE_S";
constexpr const char* kEnvFileNameEnv = "DS_ENV_FILE";          // DeepSpeed's override of the name
constexpr const char* kDefaultEnvFileName = ".deepspeed_env";

// Counts directory entries whose name is `prefix` followed by digits only.
int count_numbered_entries(const char* dir_path, const char* prefix) {
  DIR* dir = ::opendir(dir_path);
  if (dir == nullptr) return 0;
  int count = 0;
  std::size_t prefix_len = std::strlen(prefix);
  while (dirent* entry = ::readdir(dir)) {
    const char* name = entry->d_name;
    if (std::strncmp(name, prefix, prefix_len) != 0) continue;
    const char* digits = name + prefix_len;
    if (*digits == '\0') continue;
    bool all_digits = true;
    for (const char* p = digits; *p != '\0'; ++p) all_digits = all_digits && std::isdigit(*p);
    if (all_digits) ++count;
  }
  ::closedir(dir);
  return count;
}

// Device nodes come first because a container sees only the GPUs it was given there, while
// /proc/driver/nvidia/gpus lists every GPU of the host; the /proc fallback covers hosts whose
// nodes are created lazily on first CUDA use. Deliberately not cuInit(): the launcher stays
// CUDA-free and fast, and the ranks pick their own device from LOCAL_RANK.
int detect_gpu_count() {
  int nodes = count_numbered_entries("/dev", "nvidia");
  if (nodes > 0) return nodes;
  DIR* dir = ::opendir("/proc/driver/nvidia/gpus");
  if (dir == nullptr) return 0;
  int count = 0;
  while (dirent* entry = ::readdir(dir)) {
    if (entry->d_name[0] != '.') ++count;
  }
  ::closedir(dir);
  return count;
}

std::vector<int> detect_available_cores() {
  std::vector<int> cores;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) {
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
      if (CPU_ISSET(cpu, &set)) cores.push_back(cpu);
    }
  }
  return cores;
}

std::string current_directory() {
  char buffer[PATH_MAX];
  return ::getcwd(buffer, sizeof(buffer)) != nullptr ? buffer : ".";
}

std::string own_executable() {
  char buffer[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buffer, sizeof(buffer) - 1);
  return n > 0 ? std::string(buffer, static_cast<std::size_t>(n)) : "deepspeed";
}

bool is_regular_file(const std::string& path) {
  struct stat st{};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::vector<std::pair<std::string, std::string>> read_env_files(const std::string& home, const std::string& cwd) {
  const char* name_env = std::getenv(kEnvFileNameEnv);
  const std::string name = name_env != nullptr && *name_env != '\0' ? name_env : kDefaultEnvFileName;
  std::vector<std::string> candidates;
  if (!home.empty()) candidates.push_back(home + "/" + name);
  std::string local = cwd + "/" + name;
  if (candidates.empty() || local != candidates.front()) candidates.push_back(local);
  std::vector<std::pair<std::string, std::string>> files;
  for (const std::string& path : candidates) {
    if (!is_regular_file(path)) continue;
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    files.emplace_back(path, text.str());
  }
  return files;
}

}  // namespace

HostInfo detect_host_info() {
  HostInfo host;
  if (const char* cvd = std::getenv("CUDA_VISIBLE_DEVICES"); cvd != nullptr && *cvd != '\0') {
    host.cuda_visible_devices = cvd;
  }
  host.gpu_count = detect_gpu_count();
  host.available_cores = detect_available_cores();
  if (const char* path = std::getenv("PATH")) host.path_env = path;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    std::string kv(*entry);
    std::size_t eq = kv.find('=');
    if (eq == std::string::npos) continue;
    host.environment.emplace_back(kv.substr(0, eq), kv.substr(eq + 1));
  }
  host.cwd = current_directory();
  host.self_exe = own_executable();
  const char* home = std::getenv("HOME");
  host.deepspeed_env_files = read_env_files(home != nullptr ? home : "", host.cwd);
  return host;
}

double kill_grace_seconds_from_env() {
  const char* value = std::getenv(kKillGraceEnv);
  if (value == nullptr || *value == '\0') return kDefaultKillGraceSeconds;
  char* end = nullptr;
  double seconds = std::strtod(value, &end);
  if (end == value || *end != '\0' || !(seconds >= 0.0)) {
    throw UsageError(std::string(kKillGraceEnv) + "='" + value +
                     "': expected a non-negative number of seconds (default 30)");
  }
  return seconds;
}

std::optional<std::string> find_on_path(const std::string& name, const std::string& path_env) {
  std::size_t start = 0;
  while (start <= path_env.size()) {
    std::size_t colon = path_env.find(':', start);
    std::string dir = path_env.substr(start, colon == std::string::npos ? std::string::npos : colon - start);
    if (dir.empty()) dir = ".";
    std::string candidate = dir + "/" + name;
    struct stat st{};
    if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(candidate.c_str(), X_OK) == 0) {
      return candidate;
    }
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  return std::nullopt;
}

}  // namespace deepspeed::launcher
