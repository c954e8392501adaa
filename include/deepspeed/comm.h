// deepspeed::comm — every collective of the engine goes through this one layer.
// init_distributed() reads RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT, rendezvous through a c10d TCPStore, and builds Gloo (CPU tensors) and, in CUDA
// builds, NCCL (CUDA tensors) process groups. Each collective gets a per-rank sequence number;
// on a failure or timeout the job fails with a cross-rank report (which ranks never issued
// collective #k, its name, size and phase) instead of hanging or dying mute.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "deepspeed/errors.h"

namespace deepspeed::comm {

/// What the engine is doing when it issues a collective; shown in timeout reports.
enum class Phase { kInit, kForward, kBackward, kStep, kCheckpoint, kOther };
const char* phase_name(Phase phase);

enum class ReduceOp { kSum, kAvg, kMax, kMin };

struct InitOptions {
  /// Per-collective timeout. Default: $DEEPSPEED_TIMEOUT minutes, else 10 minutes (DeepSpeed's).
  std::chrono::milliseconds timeout{0};
  /// Overrides of the environment (tests); -1 / "" means "read the environment".
  int rank = -1;
  int world_size = -1;
  std::string master_addr;
  int master_port = -1;
};

/// Sets up the default process group from the environment. Without RANK/WORLD_SIZE in the
/// environment it starts a single-process group (rank 0 of 1). Calling it twice is a no-op.
/// Throws CommError naming the variable or address that was wrong.
void init_distributed(const InitOptions& options = {});
bool is_initialized();
/// Tears down the process groups and the store (after a barrier when `sync` is true).
void destroy_process_group(bool sync = true);

int get_rank();
int get_world_size();
int get_local_rank();
int get_local_world_size();

/// Sets the phase recorded with the following collectives; returns the previous one.
Phase set_phase(Phase phase);
Phase current_phase();

/// RAII phase scope.
class PhaseScope {
 public:
  explicit PhaseScope(Phase phase) : previous_(set_phase(phase)) {}
  ~PhaseScope() { set_phase(previous_); }
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  Phase previous_;
};

/// An issued collective. wait() blocks until it is complete; the tensors passed to the call
/// must stay alive and untouched until then. wait() throws CommError with the cross-rank report
/// when the collective failed or timed out.
class Handle {
 public:
  struct State;
  Handle() = default;
  explicit Handle(std::shared_ptr<State> state) : state_(std::move(state)) {}
  void wait();
  bool valid() const { return state_ != nullptr; }
  /// The sequence number of this collective on this rank (1-based).
  int64_t seq() const;

 private:
  std::shared_ptr<State> state_;
};

/// All collectives take flat contiguous tensors. `async_op` false waits before returning.
Handle all_reduce(at::Tensor& tensor, ReduceOp op = ReduceOp::kSum, bool async_op = false);
/// `output` has world_size * input.numel() elements; rank r's input lands at r * input.numel().
Handle all_gather(at::Tensor& output, const at::Tensor& input, bool async_op = false);
/// One output per rank (each contiguous, input.numel() elements); `input` may be one of them.
Handle all_gather(std::vector<at::Tensor>& outputs, const at::Tensor& input,
                  bool async_op = false);
/// `input` has world_size * output.numel() elements; rank r receives the reduction of slice r.
Handle reduce_scatter(at::Tensor& output, const at::Tensor& input, ReduceOp op = ReduceOp::kSum,
                      bool async_op = false);
/// Reduces every rank's `tensor` into rank `dst`'s (other ranks' contents are unspecified
/// afterwards, as in torch.distributed.reduce).
Handle reduce(at::Tensor& tensor, int dst, ReduceOp op = ReduceOp::kSum, bool async_op = false);
Handle broadcast(at::Tensor& tensor, int src, bool async_op = false);
void barrier();

/// Number of collectives this rank has issued.
int64_t sequence_number();

}  // namespace deepspeed::comm
