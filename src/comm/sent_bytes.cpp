// Sent-byte accounting: one atomic total per process, fed by every collective at issue.
#include "comm/sent_bytes.h"

#include <atomic>
#include <cstring>

#include "deepspeed/comm.h"

namespace deepspeed::comm {
namespace {

std::atomic<int64_t>& total() {
  static std::atomic<int64_t> bytes{0};
  return bytes;
}

}  // namespace

int64_t bytes_sent() { return total().load(); }

namespace detail {

int64_t sent_bytes_of(const char* op, int64_t message_bytes, int group_size, bool is_root) {
  const int64_t s = message_bytes;
  const int64_t n = group_size;
  if (n <= 1) return 0;
  auto is = [op](const char* name) { return std::strcmp(op, name) == 0; };
  // Ring all-reduce: a reduce-scatter and an all-gather, each sending (n-1)/n of the message.
  if (is("all_reduce") || is("reduce_scatter") || is("barrier")) return 2 * (n - 1) * s / n;
  if (is("all_gather")) return (n - 1) * s;  // this rank's share to every other rank
  if (is("all_to_all_single")) return (n - 1) * s / n;  // every slice but its own
  if (is("broadcast")) return is_root ? s : 0;
  if (is("reduce")) return is_root ? 0 : s;
  return s;
}

void count_sent_bytes(const char* op, int64_t message_bytes, int group_size, bool is_root) {
  total().fetch_add(sent_bytes_of(op, message_bytes, group_size, is_root));
}

}  // namespace detail
}  // namespace deepspeed::comm
