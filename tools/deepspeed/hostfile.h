// The hostfile (-H/--hostfile, default /job/hostfile): DeepSpeed's MPI-style list of machines and
// how many ranks each may run. Owns parsing and its error messages; resource_filter.h narrows the
// pool with --include/--exclude/--num_nodes/--num_gpus.
//
// Format (DeepSpeed's runner.py): one `<host> slots=<count>` per line, in rank order; blank lines
// and lines whose first non-blank character is '#' are skipped; anything after the slots token is
// ignored (so OpenMPI's `max_slots=` and trailing comments pass, as with DeepSpeed's regex).
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace deepspeed::launcher {

inline constexpr const char* kDefaultHostfile = "/job/hostfile";  // DeepSpeed's DLTS_HOSTFILE

struct HostSlots {
  std::string host;
  int slots = 0;  // ranks this host may run: slot indices 0..slots-1 (GPU ids on a GPU host)
  int line = 0;   // 1-based line in the hostfile, for messages
};

// Hosts in file order; the order defines rank order.
using ResourcePool = std::vector<HostSlots>;

// Parses hostfile text. `path` only names the file in messages. Throws UsageError naming the path,
// line number and line for: a line that is not `<host> slots=<count>`, a count that is not a
// positive integer, a host listed twice (with both lines), and a file without any host line.
ResourcePool parse_hostfile(const std::string& text, const std::string& path);

// Reads and parses `path`; nullopt when the file does not exist (DeepSpeed then warns and runs on
// this machine only). Throws UsageError when it exists but cannot be read or is malformed.
std::optional<ResourcePool> read_hostfile(const std::string& path);

// Total slots of the pool.
int total_slots(const ResourcePool& pool);

}  // namespace deepspeed::launcher
