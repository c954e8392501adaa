// Point-to-point calls of deepspeed::comm (torch.distributed's send / recv / isend / irecv),
// kept beside comm.h so that the collectives' users do not depend on them. Implemented in
// src/comm/p2p.cpp; the pipeline engine passes activations and gradients between stages this way.
#pragma once

#include <ATen/core/Tensor.h>

#include "deepspeed/comm.h"

namespace deepspeed::comm {

/// Point-to-point (torch.distributed's send / recv / isend / irecv) between this rank and the
/// peer `dst` / `src`, a GLOBAL rank that must be another member of `group` (the pipeline's
/// stages pass activations and gradients this way). `tensor` is flat-contiguous; the receiver's
/// tensor must have the sender's element count and dtype. Messages between two ranks with the
/// same group and `tag` (0 <= tag < 2^20) arrive in the order they were sent.
/// With the collective check on (DS_COMM_CHECK_COLLECTIVES, default 1) the sender first sends
/// a small header (element count, dtype, its call number and phase) and the receiver compares
/// it with its tensor: a mismatch is a CommError naming both sides, after the message was
/// drained into a scratch buffer so that the sender completes, instead of Gloo aborting.
/// Each call is numbered among this rank's calls (sequence_number()) and recorded by the comms
/// logger as "send" / "recv", but not counted among the group's collectives.
/// send / recv block until the message left / arrived (Gloo's send completes once the peer
/// posted the matching receive). isend / irecv return a Handle; `tensor` must stay alive and
/// untouched until its wait() returns. irecv's payload may only be received in wait().
/// Throws UsageError (peer not a member, the peer is this rank, bad tag) and CommError (timeout,
/// mismatch, closed connection).
void send(const at::Tensor& tensor, int dst, const Group& group = world(), int tag = 0);
void recv(at::Tensor& tensor, int src, const Group& group = world(), int tag = 0);
Handle isend(const at::Tensor& tensor, int dst, const Group& group = world(), int tag = 0);
Handle irecv(at::Tensor& tensor, int src, const Group& group = world(), int tag = 0);

}  // namespace deepspeed::comm
