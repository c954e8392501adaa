// What a comm::Handle holds: the c10d work, the record for the failure report and the step that
// finishes the call on completion. Shared by the collectives (collectives.cpp) and the
// point-to-point calls (p2p.cpp).
#pragma once

#include <functional>

#include <torch/csrc/distributed/c10d/Work.hpp>

#include "comm/communicator.h"
#include "deepspeed/comm.h"

namespace deepspeed::comm {

struct Handle::State {
  c10::intrusive_ptr<c10d::Work> work;
  Group group;  // for the report when wait() fails
  detail::CollectiveRecord record;
  std::function<void()> on_complete;  // e.g. copy a slice out after an emulated reduce_scatter
  bool done = false;
  /// Point-to-point calls: the report for a failed wait() (empty: the collective report).
  std::function<std::string(const std::string&)> p2p_report;
};

}  // namespace deepspeed::comm
