// What the comms logger recorded on this rank, summarised for tests that count collectives.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "deepspeed/comms_logging.h"

namespace deepspeed::testing {

/// This rank's collectives recorded under `record` (e.g. "all_gather", or "all_gather (group
/// zero_hpz)") since the log was last reset: message size (bytes) -> count.
inline std::map<int64_t, int64_t> logged_message_sizes(const std::string& record) {
  std::map<int64_t, int64_t> out;
  for (const auto& e : comm::comms_log_entries()) {
    if (e.record_name == record) out[e.msg_size_bytes] += e.count;
  }
  return out;
}

}  // namespace deepspeed::testing
