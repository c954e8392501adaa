// The process-wide communicator behind deepspeed::comm: store, process groups, the sequence
// counters and the per-rank record of the last collective issued on each group (for timeout
// reports).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "deepspeed/comm.h"
#include "util/torch_compat.h"

namespace deepspeed::comm {

/// What a Group shares among its copies. `id` 0 is the world; new_group's i-th call gets id i,
/// the same on every rank, which names the group's keys in the store.
struct Group::Impl {
  std::string name;
  int id = 0;
  std::vector<int> ranks;  // global ranks in group order
  int rank = -1;           // this rank's group rank; -1 for a non-member
  int64_t generation = 0;  // the Communicator's init count when created (stale after destroy)
  c10::intrusive_ptr<compat::CollectiveBackend> gloo;  // members of groups of size > 1 only
  c10::intrusive_ptr<compat::CollectiveBackend> nccl;  // CUDA builds with a GPU only
  int64_t seq = 0;  // collectives issued on this group by this rank (guarded by the mutex)
};

}  // namespace deepspeed::comm

namespace deepspeed::comm::detail {

/// What one collective was, as shown in reports:
/// "#7 all_reduce (5289472 x float, phase backward)" on the world,
/// "#7 all_reduce on group data(2) [0, 2] (5289472 x float, phase backward)" on a sub-group.
/// `seq` counts the collectives of the group (comparable across its members), `rank_seq` every
/// collective of this rank (Handle::seq(), the comms logger's key).
struct CollectiveRecord {
  int64_t seq = 0;
  int64_t rank_seq = 0;
  std::string group;  // Group::describe(); empty for the world
  std::string name;
  int64_t numel = 0;
  std::string dtype;
  Phase phase = Phase::kOther;

  std::string describe() const;
  std::string encode() const;
  static CollectiveRecord decode(const std::string& text);
};

/// "[rank R/W] " prefix for messages.
std::string detail_str(int rank, int world);

class Communicator {
 public:
  static Communicator& instance();

  void init(const InitOptions& options);
  bool initialized() const { return initialized_; }
  void destroy(bool sync);

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  int local_rank() const { return local_rank_; }
  int local_world_size() const { return local_world_size_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

  /// `group`'s process group for `tensor`'s device: Gloo for CPU tensors, NCCL for CUDA
  /// tensors. Throws UsageError when this rank is not a member.
  compat::CollectiveBackend& backend_for(const Group& group, const at::Tensor& tensor);
  c10d::Store& store() { return *store_; }

  /// The world group (empty before init()).
  const Group& world() const { return world_; }
  /// new_group(): see deepspeed/comm.h.
  Group new_group(std::vector<int> ranks, const std::string& name);
  Group self_group(const std::string& name) const;
  /// Throws (UsageError) unless `group` can run `collective` on this rank: initialized, not
  /// empty, not from before a destroy_process_group(), and this rank a member.
  void check_usable(const Group& group, const char* collective) const;

  /// Assigns the next sequence numbers and publishes the record to the store (so that other
  /// members can tell, on a timeout, how far this rank got on `group`).
  CollectiveRecord begin(const char* name, const at::Tensor& tensor, const Group& group);
  /// The record of a point-to-point call: numbered among this rank's calls (rank_seq) but not
  /// among the group's collectives, whose numbers every member must agree on (p2p.cpp).
  CollectiveRecord begin_p2p(const char* name, const at::Tensor& tensor, const Group& group);
  /// Builds the cross-rank report for a failed collective on `group` (reads every member's last
  /// record).
  std::string failure_report(const CollectiveRecord& record, const Group& group,
                             const std::string& error);
  void barrier(const Group& group);

  int64_t seq() const { return seq_; }
  Phase phase = Phase::kOther;

 private:
  c10::intrusive_ptr<compat::CollectiveBackend> make_gloo(c10::intrusive_ptr<c10d::Store> store,
                                                          int rank, int size,
                                                          const std::string& what);
  /// Members of a new group agree on its ranks and name (its first member publishes them).
  void check_group_agreement(const Group::Impl& group);

  bool initialized_ = false;
  int rank_ = 0;
  int world_size_ = 1;
  int local_rank_ = 0;
  int local_world_size_ = 1;
  std::chrono::milliseconds timeout_{600000};
  int64_t seq_ = 0;
  int64_t generation_ = 0;  // init() count: groups made before a destroy() are stale
  int next_group_id_ = 1;   // new_group() calls so far + 1, the same on every rank
  Group world_;
  c10::intrusive_ptr<c10d::ProcessGroupGloo::Options> gloo_options_;  // reused by sub-groups
  mutable std::mutex mutex_;
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<compat::CollectiveBackend> gloo_;
  c10::intrusive_ptr<compat::CollectiveBackend> nccl_;  // CUDA builds with a GPU only
};

}  // namespace deepspeed::comm::detail
