// FlatGroup: one optimizer param group of ZeRO 1/2, flattened. The group's trainable parameters
// are laid end to end in one buffer, zero-padded to a multiple of 2*W elements (DeepSpeed's
// nccl_start_alignment_factor: 4-byte aligned partition starts), and each parameter becomes a view
// of that buffer. Rank r owns the contiguous slice [r*P, (r+1)*P) with P = padded / W; a parameter
// may straddle two slices, and all padding sits at the end.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace deepspeed::runtime {

struct FlatSlot {
  at::Tensor param;  // the model's parameter (now a view of FlatGroup::flat)
  std::string name;
  int64_t offset = 0;  // first element in the flat buffer
  int64_t numel = 0;
};

/// The part [param_offset, param_offset + numel) of slot `slot` that lies in this rank's slice,
/// at `partition_offset` inside the slice.
struct OwnedPiece {
  size_t slot = 0;
  int64_t param_offset = 0;
  int64_t partition_offset = 0;
  int64_t numel = 0;
};

class FlatGroup {
 public:
  /// Flattens `params` (same dtype and device; copied into the buffer, then re-pointed to it).
  /// `round_robin`: DeepSpeed's round_robin_gradients order (parameter i goes to list i mod W,
  /// lists concatenated), which defines the layout and the checkpoint's param_shapes order.
  FlatGroup(std::vector<at::Tensor> params, std::vector<std::string> names, int world_size,
            int rank, bool round_robin);

  const std::vector<FlatSlot>& slots() const { return slots_; }
  const std::vector<OwnedPiece>& owned_pieces() const { return owned_; }
  at::Tensor& flat() { return flat_; }
  const at::Tensor& flat() const { return flat_; }
  /// Rank r's slice of the flat buffer (a view).
  at::Tensor partition(int r) const;
  int64_t numel() const { return numel_; }
  int64_t padded_numel() const { return padded_numel_; }
  int64_t partition_numel() const { return partition_numel_; }
  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  /// Rank owning flat element `index` (< padded_numel()).
  int owner_of(int64_t index) const { return static_cast<int>(index / partition_numel_); }

 private:
  std::vector<FlatSlot> slots_;
  std::vector<OwnedPiece> owned_;
  at::Tensor flat_;
  int64_t numel_ = 0;
  int64_t padded_numel_ = 0;
  int64_t partition_numel_ = 0;
  int world_size_ = 1;
  int rank_ = 0;
};

}  // namespace deepspeed::runtime
