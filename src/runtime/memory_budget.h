// An imposed memory budget for the training process: the CPU stand-in for an accelerator's
// memory size, so that a configuration that needs more than a device would hold fails with
// OutOfMemoryError instead of swapping. DS_MEMORY_BUDGET_BYTES=N lets the engine map at most N
// more bytes of private writable memory than the process held when the engine was created
// (Linux RLIMIT_DATA, as tests/support/memory_limit.h). The autotuner sets it for every experiment
// and reads the same figure as "memory per GPU" (docs/autotuning.md).
#pragma once

#include <cstdint>
#include <optional>

namespace deepspeed::runtime {

/// Reads DS_MEMORY_BUDGET_BYTES and, when set, bounds the process's data memory to what it holds
/// now plus the budget (once per process; later calls keep the first base). Returns the budget.
std::optional<int64_t> apply_memory_budget_from_env();

/// Bytes the process holds beyond the base taken at the first call of apply_memory_budget_from_env
/// (VmData now minus the free blocks of the host caching allocator, which it gives back before
/// failing). Before that call the base is 0.
int64_t memory_in_use_since_base();

/// The resident set's high-water mark since the base (reset there), minus the base's resident set.
int64_t peak_resident_since_base();

/// The budget's peak as well as it can be seen from samples: the resident high-water mark plus
/// the data memory mapped since the base but not resident now (a thread's BLAS buffer, mapped
/// whole and touched in part). The budget counts mapped memory, the high-water mark only touched
/// pages, and a transient between samples (a step's all-gather buffer) is only in the latter; so
/// neither alone bounds what the budget saw.
int64_t peak_mapped_since_base();

/// Bytes of live allocations (glibc's in-use and mmap'ed chunks, mallinfo2, plus the host caching
/// allocator's blocks in use): unlike VmData it drops when memory is freed and grows when freed
/// memory is reused, so the difference over a forward is the activations it keeps.
int64_t live_allocated_bytes();

}  // namespace deepspeed::runtime
