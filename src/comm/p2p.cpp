// Point-to-point send / recv of deepspeed::comm (see deepspeed/comm.h): the peer is checked
// against the group, the header exchange stands in for the collective check, and a failure
// names the peer. Owns nothing beyond the call; collectives live in collectives.cpp.
#include <ATen/ATen.h>

#include <cctype>
#include <deque>
#include <map>
#include <sstream>
#include <tuple>

#include "comm/collective_fingerprint.h"
#include "comm/communicator.h"
#include "comm/comms_logger.h"
#include "comm/handle_state.h"
#include "deepspeed/comm.h"
#include "deepspeed/comm_p2p.h"
#include "util/check.h"

namespace deepspeed::comm {
namespace detail {

CollectiveRecord Communicator::begin_p2p(const char* name, const at::Tensor& tensor,
                                         const Group& group) {
  DS_CHECK(initialized_, CommError, name,
           ": deepspeed::comm is not initialized; call init_distributed() first");
  check_usable(group, name);
  CollectiveRecord r;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    r.rank_seq = ++seq_;
    r.seq = r.rank_seq;  // not the group's count: only two of its members take part
  }
  r.name = name;
  if (group.impl()->id != 0) r.group = group.describe();
  r.numel = tensor.numel();
  r.dtype = c10::toString(tensor.scalar_type());
  for (auto& ch : r.dtype) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  r.phase = phase;
  return r;
}

}  // namespace detail

namespace {

using detail::Communicator;

constexpr int kMaxTag = 1 << 20;
// The header travels on its own Gloo slot beside the payload's, so the two never mix.
constexpr int kHeaderTagBit = 1 << 20;
// numel, dtype, sender's call number, sender's phase.
constexpr int64_t kHeaderFields = 4;

std::string error_text(const std::exception& e) {
  if (auto* ce = dynamic_cast<const c10::Error*>(&e)) return ce->what_without_backtrace();
  return e.what();
}

std::string dtype_name(int64_t dtype) {
  std::string type = c10::toString(static_cast<c10::ScalarType>(dtype));
  for (auto& ch : type) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return type;
}

// Gloo in LibTorch 1.13 has no bfloat16: the bits travel as fp16 (moved, never computed on).
at::Tensor wire(const at::Tensor& t) {
  return t.scalar_type() == at::kBFloat16 ? t.view(at::kHalf) : t;
}

struct Call {
  const char* name;  // "send" / "recv"
  int peer;          // global rank
  int peer_in_group;
  int tag;
};

// "[rank 1/2] recv of 64 x float from rank 0 on group pipe(2) [0, 1] (tag 0, phase forward)"
std::string describe(const Communicator& c, const Call& call, const detail::CollectiveRecord& r,
                     const Group& group) {
  std::ostringstream os;
  os << detail::detail_str(c.rank(), c.world_size()) << call.name << " #" << r.rank_seq << " of "
     << r.numel << " x " << r.dtype << (std::string(call.name) == "send" ? " to" : " from")
     << " rank " << call.peer;
  if (group.impl()->id != 0) os << " on group " << group.describe();
  os << " (tag " << call.tag << ", phase " << phase_name(r.phase) << ")";
  return os.str();
}

Call check_call(Communicator& c, const char* name, const at::Tensor& tensor, int peer,
                const Group& group, int tag) {
  DS_CHECK(c.initialized(), CommError, name,
           ": deepspeed::comm is not initialized; call init_distributed() first");
  c.check_usable(group, name);
  DS_CHECK(tensor.defined() && tensor.is_contiguous(), CommError, name,
           ": tensor must be a defined, contiguous tensor");
  DS_CHECK(tag >= 0 && tag < kMaxTag, UsageError, detail::detail_str(c.rank(), c.world_size()),
           name, ": tag ", tag, " is outside [0, ", kMaxTag, ")");
  const char* role = std::string(name) == "send" ? "dst" : "src";
  const int g = group.group_rank(peer);
  DS_CHECK(peer >= 0 && peer < c.world_size() && g >= 0, UsageError,
           detail::detail_str(c.rank(), c.world_size()), name, ": ", role, " rank ", peer,
           " is not a member of group ", group.describe(), " (", role,
           " is a global rank, as in torch.distributed)");
  DS_CHECK(peer != c.rank(), UsageError, detail::detail_str(c.rank(), c.world_size()), name, ": ",
           role, " rank ", peer, " is this rank; a rank cannot ", name, " to itself");
  return Call{name, peer, g, tag};
}

std::shared_ptr<Handle::State> new_state(Communicator& c, const Call& call,
                                         const at::Tensor& tensor, const Group& group) {
  auto state = std::make_shared<Handle::State>();
  state->record = c.begin_p2p(call.name, tensor, group);
  state->group = group;
  const std::string where = describe(c, call, state->record, group);
  const auto timeout_s = c.timeout().count() / 1000.0;
  const int peer = call.peer;
  const bool is_send = std::string(call.name) == "send";
  state->p2p_report = [where, timeout_s, peer, is_send](const std::string& error) {
    std::ostringstream os;
    os << where << " failed after at most " << timeout_s << " s: " << error << "\nrank " << peer
       << (is_send ? " never posted the matching recv" : " never sent the matching message")
       << " (or exited). Both ranks must issue matching send/recv pairs in the same order on "
          "the same group and tag; look for a rank that skipped a step or ran a different "
          "schedule.";
    return os.str();
  };
  detail::comms_log_issue(state->record.rank_seq, call.name, tensor, 2,
                          group.impl()->id == 0 ? std::string() : group.name());
  return state;
}

// Issues `issue()` and turns a synchronous c10d failure into the report.
template <typename Issue>
c10::intrusive_ptr<c10d::Work> guarded(const Handle::State& state, Issue issue) {
  try {
    return issue();
  } catch (const std::exception& e) {
    throw CommError(state.p2p_report(error_text(e)));
  }
}

}  // namespace

Handle isend(const at::Tensor& tensor, int dst, const Group& group, int tag) {
  auto& c = Communicator::instance();
  const Call call = check_call(c, "send", tensor, dst, group, tag);
  auto state = new_state(c, call, tensor, group);
  auto& backend = c.backend_for(group, tensor);
  c10::intrusive_ptr<c10d::Work> header_work;
  if (detail::collective_check_enabled()) {
    at::Tensor header = at::empty({kHeaderFields}, at::kLong);
    int64_t* h = header.data_ptr<int64_t>();
    h[0] = tensor.numel();
    h[1] = static_cast<int64_t>(tensor.scalar_type());
    h[2] = state->record.rank_seq;
    h[3] = static_cast<int64_t>(state->record.phase);
    header_work = guarded(*state, [&] {
      std::vector<at::Tensor> ts{header};
      return backend.send(ts, call.peer_in_group, tag | kHeaderTagBit);
    });
    // The header tensor must outlive its send: the completion step holds it.
    auto timeout = c.timeout();
    auto report = state->p2p_report;
    state->on_complete = [header_work, header, timeout, report]() {
      try {
        header_work->wait(timeout);
      } catch (const std::exception& e) {
        throw CommError(report(error_text(e)));
      }
    };
  }
  at::Tensor payload = wire(tensor);
  state->work = guarded(*state, [&] {
    std::vector<at::Tensor> ts{payload};
    return backend.send(ts, call.peer_in_group, tag);
  });
  return Handle(std::move(state));
}

namespace {

// Note [Receive order]: with the header check, an irecv posts its header receive at once and
// its payload receive only once the header was compared (a larger message into a smaller buffer
// aborts Gloo's I/O thread). Gloo matches receives to messages in the order they are posted, so
// payloads must be posted in issue order whatever order the handles are waited in: each
// (group, peer, tag) keeps a queue of irecvs whose payload is not posted yet, and a wait() posts
// every earlier one first.
struct PendingRecv {
  compat::CollectiveBackend* backend = nullptr;  // the group's, kept alive by the Handle's group
  Call call{};
  at::Tensor header, target, scratch;
  c10::intrusive_ptr<c10d::Work> header_work, payload_work;
  std::chrono::milliseconds timeout{0};
  std::function<std::string(const std::string&)> report;
  std::string where;
  std::string mismatch;  // the error to throw at this receive's wait, if any
  bool posted = false;

  // Compares the header with the tensor and posts the payload receive (into a scratch buffer
  // on a mismatch, so that the sender completes).
  void post() {
    try {
      header_work->wait(timeout);
    } catch (const std::exception& e) {
      throw CommError(report(error_text(e)));
    }
    const int64_t* h = header.data_ptr<int64_t>();
    const bool same = h[0] == target.numel() && h[1] == static_cast<int64_t>(target.scalar_type());
    at::Tensor into = target;
    if (!same) {
      scratch = at::empty({h[0]}, at::TensorOptions().dtype(static_cast<c10::ScalarType>(h[1])));
      into = scratch;
      std::ostringstream os;
      os << where << ": rank " << call.peer << " sent " << h[0] << " x " << dtype_name(h[1])
         << " (its call #" << h[2] << ", phase " << phase_name(static_cast<Phase>(h[3]))
         << "); this rank expected " << target.numel() << " x "
         << dtype_name(static_cast<int64_t>(target.scalar_type()))
         << ". The two ranks disagree on the message: check the shapes and dtypes each side "
            "uses for this exchange (nothing was written into the receive tensor).";
      mismatch = os.str();
    }
    try {
      std::vector<at::Tensor> ts{wire(into)};
      payload_work = backend->recv(ts, call.peer_in_group, call.tag);
    } catch (const std::exception& e) {
      throw CommError(report(error_text(e)));
    }
    posted = true;
  }
};

using RecvQueueKey = std::tuple<int, int, int>;  // group id, peer (global rank), tag
std::map<RecvQueueKey, std::deque<std::shared_ptr<PendingRecv>>>& recv_queues() {
  static std::map<RecvQueueKey, std::deque<std::shared_ptr<PendingRecv>>> queues;
  return queues;
}

}  // namespace

Handle irecv(at::Tensor& tensor, int src, const Group& group, int tag) {
  auto& c = Communicator::instance();
  const Call call = check_call(c, "recv", tensor, src, group, tag);
  auto state = new_state(c, call, tensor, group);
  auto& backend = c.backend_for(group, tensor);
  if (!detail::collective_check_enabled()) {
    at::Tensor payload = wire(tensor);
    state->work = guarded(*state, [&] {
      std::vector<at::Tensor> ts{payload};
      return backend.recv(ts, call.peer_in_group, call.tag);
    });
    return Handle(std::move(state));
  }
  auto pending = std::make_shared<PendingRecv>();
  pending->backend = &backend;
  pending->call = call;
  pending->header = at::empty({kHeaderFields}, at::kLong);
  pending->target = tensor;
  pending->timeout = c.timeout();
  pending->report = state->p2p_report;
  pending->where = describe(c, call, state->record, group);
  pending->header_work = guarded(*state, [&] {
    std::vector<at::Tensor> ts{pending->header};
    return backend.recv(ts, call.peer_in_group, tag | kHeaderTagBit);
  });
  const RecvQueueKey key{group.impl()->id, call.peer, tag};
  recv_queues()[key].push_back(pending);
  // See Note [Receive order].
  state->on_complete = [pending, key]() {
    auto& queue = recv_queues()[key];
    while (!pending->posted && !queue.empty()) {
      std::shared_ptr<PendingRecv> front = queue.front();
      queue.pop_front();
      front->post();
    }
    DS_INTERNAL_ASSERT(pending->posted, "irecv: the receive was not in its queue");
    try {
      pending->payload_work->wait(pending->timeout);
    } catch (const std::exception& e) {
      throw CommError(pending->report(error_text(e)));
    }
    DS_CHECK(pending->mismatch.empty(), CommError, pending->mismatch);
  };
  return Handle(std::move(state));
}

void send(const at::Tensor& tensor, int dst, const Group& group, int tag) {
  isend(tensor, dst, group, tag).wait();
}

void recv(at::Tensor& tensor, int src, const Group& group, int tag) {
  irecv(tensor, src, group, tag).wait();
}

}  // namespace deepspeed::comm
