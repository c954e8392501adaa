// The process-wide communicator behind deepspeed::comm: store, process groups, the sequence
// counter and the per-rank record of the last collective issued (for timeout reports).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "deepspeed/comm.h"
#include "util/torch_compat.h"

namespace deepspeed::comm::detail {

/// What one collective was, as shown in reports: "#7 all_reduce (5289472 x float, backward)".
struct CollectiveRecord {
  int64_t seq = 0;
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

  /// The process group for `tensor`'s device: Gloo for CPU tensors, NCCL for CUDA tensors.
  compat::CollectiveBackend& backend_for(const at::Tensor& tensor);
  c10d::Store& store() { return *store_; }

  /// Assigns the next sequence number and publishes the record to the store (so that other
  /// ranks can tell, on a timeout, how far this rank got).
  CollectiveRecord begin(const char* name, const at::Tensor& tensor);
  /// Builds the cross-rank report for a failed collective (reads every rank's last record).
  std::string failure_report(const CollectiveRecord& record, const std::string& error);
  void barrier();

  int64_t seq() const { return seq_; }
  Phase phase = Phase::kOther;

 private:
  bool initialized_ = false;
  int rank_ = 0;
  int world_size_ = 1;
  int local_rank_ = 0;
  int local_world_size_ = 1;
  std::chrono::milliseconds timeout_{600000};
  int64_t seq_ = 0;
  std::mutex mutex_;
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<compat::CollectiveBackend> gloo_;
  c10::intrusive_ptr<compat::CollectiveBackend> nccl_;  // CUDA builds with a GPU only
};

}  // namespace deepspeed::comm::detail
