// The single place that calls getenv (see env.h).
#include "util/env.h"

#include <cstdlib>

#include "util/check.h"

namespace deepspeed::env {

namespace {

std::optional<std::string> raw(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

// Slurm's tasks per node: "2(x3),1" = 2 on each of the first three nodes, 1 on the fourth.
std::optional<std::string> slurm_tasks_on_this_node() {
  if (auto uniform = raw("SLURM_NTASKS_PER_NODE")) return uniform;
  auto layout = raw("SLURM_STEP_TASKS_PER_NODE");
  if (!layout) return std::nullopt;
  long node = 0;
  if (auto id = raw("SLURM_NODEID")) node = std::strtol(id->c_str(), nullptr, 10);
  std::string text = *layout;
  size_t start = 0;
  while (start < text.size()) {
    size_t comma = text.find(',', start);
    std::string group = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    size_t paren = group.find("(x");
    std::string tasks = group.substr(0, paren);
    long repeat = paren == std::string::npos ? 1 : std::strtol(group.c_str() + paren + 2, nullptr, 10);
    if (node < repeat) return tasks;
    node -= repeat;
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return std::nullopt;
}

// See Note [Launcher variables] in env.h.
std::optional<std::string> launcher_fallback(const std::string& name) {
  struct Alias {
    const char* name;
    const char* open_mpi;
    const char* slurm;    // nullptr: computed
    const char* mvapich;  // MVAPICH's mpirun
    const char* hydra;    // MPICH's and Intel MPI's mpirun (Hydra's PMI)
  };
  static constexpr Alias kAliases[] = {
      {"RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID", "MV2_COMM_WORLD_RANK", "PMI_RANK"},
      {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MV2_COMM_WORLD_LOCAL_RANK",
       "MPI_LOCALRANKID"},
      {"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_STEP_NUM_TASKS", "MV2_COMM_WORLD_SIZE",
       "PMI_SIZE"},
      {"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", nullptr, "MV2_COMM_WORLD_LOCAL_SIZE",
       "MPI_LOCALNRANKS"},
  };
  for (const Alias& alias : kAliases) {
    if (name != alias.name) continue;
    if (raw("OMPI_COMM_WORLD_SIZE")) return raw(alias.open_mpi);
    if (raw("SLURM_STEP_NUM_TASKS")) return alias.slurm != nullptr ? raw(alias.slurm) : slurm_tasks_on_this_node();
    if (raw("MV2_COMM_WORLD_SIZE")) return raw(alias.mvapich);
    if (raw("PMI_RANK") && raw("PMI_SIZE")) return raw(alias.hydra);
    return std::nullopt;
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::string> get(const char* name) {
  if (auto v = raw(name)) return v;
  return launcher_fallback(name);
}

std::optional<int64_t> get_int(const char* name) {
  auto v = get(name);
  if (!v || v->empty()) return std::nullopt;
  try {
    size_t pos = 0;
    int64_t out = std::stoll(*v, &pos);
    if (pos == v->size()) return out;
  } catch (const std::exception&) {
  }
  throw ConfigError(std::string("environment variable ") + name + "='" + *v +
                    "' is not an integer");
}

std::optional<double> get_double(const char* name) {
  auto v = get(name);
  if (!v || v->empty()) return std::nullopt;
  try {
    size_t pos = 0;
    double out = std::stod(*v, &pos);
    if (pos == v->size()) return out;
  } catch (const std::exception&) {
  }
  throw ConfigError(std::string("environment variable ") + name + "='" + *v +
                    "' is not a number");
}

}  // namespace deepspeed::env
