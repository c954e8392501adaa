// Rendezvous: every rank of the job checks in at the store before the process group is built,
// so that a rank that never arrives is named (and the job fails after one timeout, not after the
// store's wait and then Gloo's connect, each a full timeout, with Gloo's "Socket Timeout").
#pragma once

#include <chrono>
#include <string>

#include <torch/csrc/distributed/c10d/Store.hpp>

namespace deepspeed::comm::detail {

/// Registers this rank under "deepspeed/rendezvous/rank/<rank>" (its host and pid) and waits
/// until all `world` ranks have registered, for at most `timeout`. On timeout, throws CommError
/// naming the ranks that never arrived, the ones that did (host and pid), the timeout and
/// `master` ("MASTER_ADDR=A MASTER_PORT=P"). A store that fails while waiting (rank 0, which
/// serves it, gave up first) gives the same report from the last state seen.
void wait_for_all_ranks(c10d::Store& store, int rank, int world, std::chrono::milliseconds timeout,
                        const std::string& master);

}  // namespace deepspeed::comm::detail
