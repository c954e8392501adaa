// Machine and environment probing for the launcher: see host_info.h.
#include "host_info.h"

#include <dirent.h>
#include <sched.h>

#include <cctype>
#include <cstdlib>
#include <cstring>
#include <string>

#include "usage_error.h"

namespace deepspeed::launcher {
namespace {

constexpr const char* kKillGraceEnv = "DS_LAUNCHER_KILL_GRACE_S";

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

}  // namespace

HostInfo detect_host_info() {
  HostInfo host;
  if (const char* cvd = std::getenv("CUDA_VISIBLE_DEVICES"); cvd != nullptr && *cvd != '\0') {
    host.cuda_visible_devices = cvd;
  }
  host.gpu_count = detect_gpu_count();
  host.available_cores = detect_available_cores();
  if (const char* path = std::getenv("PATH")) host.path_env = path;
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

}  // namespace deepspeed::launcher
