// deepspeed::comm — every collective of the engine goes through this one layer.
// init_distributed() reads RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT, rendezvous through a c10d TCPStore, and builds Gloo (CPU tensors) and, in CUDA
// builds, NCCL (CUDA tensors) process groups. Each collective gets a per-rank sequence number;
// on a failure or timeout the job fails with a cross-rank report (which ranks never issued
// collective #k, its name, group, size and phase) instead of hanging or dying mute.
//
// Every collective runs over a Group: world() by default, or a sub-group made by new_group()
// (comm::ParallelGroups makes the data / model / pipe groups of a ProcessTopology). As in
// torch.distributed, `src` / `dst` of broadcast and reduce are GLOBAL ranks, and all_gather /
// reduce_scatter order their slices by group rank (the order of the ranks given to new_group).
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

/// This process's rank in, and the size of, the world. Code that works on data-parallel
/// replicas (ZeRO, the engine) asks its Group instead.
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

/// A set of ranks that run collectives together: a shared handle to the process groups
/// (Gloo for CPU tensors, NCCL for CUDA tensors in CUDA builds), the members' global ranks in
/// group order, and a name used in messages, timeout reports and the comms logger
/// ("data(2) [1, 3]"). Copies share the process groups. A rank that is not a member holds a
/// non-member Group (is_member() false, rank() -1): it knows the members, but a collective on
/// it throws UsageError. A default-constructed Group is empty (valid() false).
class Group {
 public:
  struct Impl;
  Group() = default;
  explicit Group(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

  bool valid() const { return impl_ != nullptr; }
  bool is_member() const;
  /// This rank's position in the group (torch's get_rank(group)); -1 when not a member.
  int rank() const;
  /// The number of members (0 for an empty group).
  int size() const;
  /// The members' global ranks, in group order.
  const std::vector<int>& ranks() const;
  const std::string& name() const;
  /// The group rank of global rank `global_rank`, or -1 when it is not a member.
  int group_rank(int global_rank) const;
  /// The global rank at group position `group_rank`.
  int global_rank(int group_rank) const;
  /// "data(2) [1, 3]": name, size and members, for messages.
  std::string describe() const;

  Impl* impl() const { return impl_.get(); }

 private:
  std::shared_ptr<Impl> impl_;
};

/// The group of every rank (named "world"). Empty before init_distributed().
Group world();

/// Creates a group of `ranks` (global ranks, distinct, in the order that becomes group order).
/// Collective over the WORLD: every rank must call new_group with the same arguments in the
/// same order (as torch.distributed.new_group), members and non-members alike; the i-th call
/// gets its own key space in the store, so groups never share keys. A member blocks until every
/// member created its side of the group. A non-member gets a non-member Group. Members check
/// that they agree on the ranks and name, and throw CommError naming both views when not.
/// Throws UsageError for an empty list, a rank outside the world or a rank listed twice.
Group new_group(std::vector<int> ranks, const std::string& name);

/// A group of this rank alone (size 1, no process group, no communication): what a
/// parallelism axis of size 1 uses. Local: no other rank needs to call it.
Group self_group(const std::string& name);

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
/// `group` (last, so that calls on the world read as before) is world() unless given; every
/// member of the group must make the call, and only members may (UsageError otherwise).
/// "size" below is group.size(), "rank r" the group rank.
Handle all_reduce(at::Tensor& tensor, ReduceOp op = ReduceOp::kSum, bool async_op = false,
                  const Group& group = world());
/// `output` has size * input.numel() elements; rank r's input lands at r * input.numel().
Handle all_gather(at::Tensor& output, const at::Tensor& input, bool async_op = false,
                  const Group& group = world());
/// One output per rank (each contiguous, input.numel() elements); `input` may be one of them.
Handle all_gather(std::vector<at::Tensor>& outputs, const at::Tensor& input,
                  bool async_op = false, const Group& group = world());
/// `input` has size * output.numel() elements; rank r receives the reduction of slice r.
Handle reduce_scatter(at::Tensor& output, const at::Tensor& input, ReduceOp op = ReduceOp::kSum,
                      bool async_op = false, const Group& group = world());
/// Reduces every member's `tensor` into global rank `dst`'s (other ranks' contents are
/// unspecified afterwards, as in torch.distributed.reduce). `dst` must be a member.
Handle reduce(at::Tensor& tensor, int dst, ReduceOp op = ReduceOp::kSum, bool async_op = false,
              const Group& group = world());
/// Copies global rank `src`'s `tensor` to every member. `src` must be a member.
Handle broadcast(at::Tensor& tensor, int src, bool async_op = false,
                 const Group& group = world());
void barrier(const Group& group = world());

/// torch.distributed.all_to_all_single with equal splits: `input` and `output` have the same
/// number of elements, a multiple of the group size; slice r (group rank order) of this rank's
/// `input` lands in slice <this rank> of rank r's `output`. Any dtype Gloo moves (bf16 travels
/// as its bits). Throws CommError when the sizes differ or do not divide.
Handle all_to_all_single(at::Tensor& output, const at::Tensor& input, bool async_op = false,
                         const Group& group = world());

/// torch.distributed.all_to_all_single with split sizes: `input`'s first input_splits[r] rows
/// (dim 0, in group rank order) go to group rank r, which writes them as its output rows from
/// source this rank; `output` has sum(output_splits) rows. Every other dimension must agree.
/// The sizes may differ by rank (each rank knows what it receives, as in torch); the cross-rank
/// collective check compares the name and dtype only. Throws CommError on inconsistent sizes.
Handle all_to_all_single(at::Tensor& output, const at::Tensor& input,
                         const std::vector<int64_t>& output_splits,
                         const std::vector<int64_t>& input_splits, bool async_op = false,
                         const Group& group = world());

/// Number of collectives this rank has issued, over all groups.
int64_t sequence_number();

/// Note [Sent bytes]
/// Bytes this rank has put on the wire in collectives since init_distributed(), over all
/// groups, counted per collective from its message size S (bytes) and the group size n under
/// the bandwidth-optimal algorithm (what NCCL's ring does; Gloo's may differ):
///   all_reduce, reduce_scatter (input S), barrier: 2(n-1)/n * S
///   all_gather (input share S): (n-1) * S;  all_to_all_single: (n-1)/n * S
///   broadcast: S on the source, 0 elsewhere;  reduce: 0 on the destination, S elsewhere
///   any other op (send, recv...): S.
/// Groups of size 1 send nothing; the collective check's own small exchanges are not counted.
/// Callers measure a step by differencing. Thread-safe.
int64_t bytes_sent();

}  // namespace deepspeed::comm
