// The per-rank count of bytes sent in collectives (Note [Sent bytes] in deepspeed/comm.h):
// collectives.cpp reports each collective it issues; comm::bytes_sent() reads the total.
#pragma once

#include <cstdint>

namespace deepspeed::comm::detail {

/// The bytes this rank sends for collective `op` with a message of `message_bytes` in a group
/// of `group_size` ranks; `is_root` marks broadcast's source and reduce's destination.
int64_t sent_bytes_of(const char* op, int64_t message_bytes, int group_size, bool is_root);

/// Adds sent_bytes_of(...) to this rank's total.
void count_sent_bytes(const char* op, int64_t message_bytes, int group_size, bool is_root);

}  // namespace deepspeed::comm::detail
