// Collective fingerprints: before a collective runs, the ranks exchange what each is about to
// issue (name, element count, dtype, root rank, reduce op) in a fixed-size all-gather, which
// cannot itself mismatch. Ranks that issue different collectives then fail with a CommError that
// names the collective, its sequence number, the sizes and the ranks, instead of Gloo aborting
// the process ("op.preamble.length <= op.nbytes"), hanging, or mixing unrelated data.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "comm/communicator.h"

namespace deepspeed::comm::detail {

/// DS_COMM_CHECK_COLLECTIVES (default 1; 0 skips the exchange, one small all-gather per
/// collective).
bool collective_check_enabled();

/// Compares `record` (with `tensor`'s dtype, `root` (-1: none) and reduce `op` (-1: none)) with
/// what every other member of `group` issues now. Throws CommError listing each rank's collective when they
/// differ, and the cross-rank timeout report (Communicator::failure_report) when a rank never
/// gets there.
void check_same_collective(Communicator& c, const CollectiveRecord& record, const Group& group,
                           const at::Tensor& tensor, int64_t root, int64_t op);

}  // namespace deepspeed::comm::detail
