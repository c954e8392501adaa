// Every environment variable deepspeed-cpp reads goes through here (one list: docs/env.md).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace deepspeed::env {

/// The raw value, or nullopt when unset.
///
/// Note [Launcher variables]: RANK, LOCAL_RANK, WORLD_SIZE and LOCAL_WORLD_SIZE, when unset, fall
/// back to what the process's launcher set instead: Open MPI's mpirun (OMPI_COMM_WORLD_RANK,
/// _LOCAL_RANK, _SIZE, _LOCAL_SIZE), else Slurm's srun (SLURM_PROCID, SLURM_LOCALID,
/// SLURM_STEP_NUM_TASKS, and the tasks on this node from SLURM_NTASKS_PER_NODE or
/// SLURM_STEP_TASKS_PER_NODE), else MVAPICH's mpirun (MV2_COMM_WORLD_RANK, _LOCAL_RANK, _SIZE,
/// _LOCAL_SIZE), else Hydra's, MPICH's and Intel MPI's (PMI_RANK, MPI_LOCALRANKID, PMI_SIZE,
/// MPI_LOCALNRANKS). Slurm's are used only inside an srun step (SLURM_STEP_NUM_TASKS set): a batch
/// script also has SLURM_PROCID=0 and SLURM_NTASKS, and a lone process there must not wait for
/// peers. This is how `deepspeed --launcher openmpi|mpich|impi|mvapich|slurm` ranks find their
/// place.
std::optional<std::string> get(const char* name);
/// An integer variable; throws ConfigError naming the variable when it is not an integer.
std::optional<int64_t> get_int(const char* name);
/// A floating-point variable; throws ConfigError naming the variable when it is not a number.
std::optional<double> get_double(const char* name);

}  // namespace deepspeed::env
