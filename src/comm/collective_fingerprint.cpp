// The fingerprint exchange before each collective and the mismatch report (see
// collective_fingerprint.h).
#include "comm/collective_fingerprint.h"

#include <cctype>
#include <cstring>
#include <sstream>
#include <vector>

#include <ATen/ATen.h>

#include "util/check.h"
#include "util/env.h"

namespace deepspeed::comm::detail {
namespace {

// One row per rank: seq, numel, dtype, root, op, phase, then the name in kNameWords words.
constexpr int64_t kNameWords = 3;  // 24 characters
constexpr int64_t kFields = 6 + kNameWords;

struct Fingerprint {
  int64_t seq = 0;
  int64_t numel = 0;
  int64_t dtype = -1;
  int64_t root = -1;
  int64_t op = -1;
  int64_t phase = 0;
  std::string name;

  bool same_collective(const Fingerprint& o) const {
    // Not seq: it counts this process's collectives, which need not agree across the ranks of a
    // group that is not the whole world.
    return name == o.name && numel == o.numel && dtype == o.dtype && root == o.root && op == o.op;
  }

  std::string describe() const {
    std::string type = dtype >= 0 ? c10::toString(static_cast<c10::ScalarType>(dtype)) : "none";
    for (auto& ch : type) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    std::ostringstream os;
    os << "#" << seq << " " << name << " (" << numel << " x " << type;
    if (root >= 0) os << ", root rank " << root;
    if (op >= 0) os << ", op " << op_name(op);
    os << ", phase " << phase_name(static_cast<Phase>(phase)) << ")";
    return os.str();
  }

  static const char* op_name(int64_t op) {
    switch (static_cast<ReduceOp>(op)) {
      case ReduceOp::kSum: return "sum";
      case ReduceOp::kAvg: return "avg";
      case ReduceOp::kMax: return "max";
      case ReduceOp::kMin: return "min";
    }
    return "?";
  }
};

at::Tensor encode(const Fingerprint& f) {
  at::Tensor row = at::zeros({kFields}, at::kLong);
  int64_t* p = row.data_ptr<int64_t>();
  p[0] = f.seq;
  p[1] = f.numel;
  p[2] = f.dtype;
  p[3] = f.root;
  p[4] = f.op;
  p[5] = f.phase;
  std::memcpy(p + 6, f.name.data(), std::min<size_t>(f.name.size(), kNameWords * 8));
  return row;
}

Fingerprint decode(const int64_t* p) {
  Fingerprint f;
  f.seq = p[0];
  f.numel = p[1];
  f.dtype = p[2];
  f.root = p[3];
  f.op = p[4];
  f.phase = p[5];
  char name[kNameWords * 8 + 1] = {};
  std::memcpy(name, p + 6, kNameWords * 8);
  f.name = name;
  return f;
}

std::string error_text(const std::exception& e) {
  if (auto* ce = dynamic_cast<const c10::Error*>(&e)) return ce->what_without_backtrace();
  return e.what();
}

}  // namespace

bool collective_check_enabled() {
  static const bool enabled = env::get_int("DS_COMM_CHECK_COLLECTIVES").value_or(1) != 0;
  return enabled;
}

void check_same_collective(Communicator& c, const CollectiveRecord& record, const Group& group,
                           const at::Tensor& tensor, int64_t root, int64_t op) {
  Fingerprint mine;
  mine.seq = record.seq;
  mine.numel = record.numel;
  mine.dtype = tensor.defined() ? static_cast<int64_t>(tensor.scalar_type()) : -1;
  mine.root = root;
  mine.op = op;
  mine.phase = static_cast<int64_t>(record.phase);
  mine.name = record.name;

  const int world = group.size();  // rows in group-rank order
  at::Tensor row = encode(mine);
  at::Tensor all = at::empty({world * kFields}, at::kLong);
  try {
    std::vector<std::vector<at::Tensor>> outs(1);
    for (int r = 0; r < world; ++r) outs[0].push_back(all.narrow(0, r * kFields, kFields));
    std::vector<at::Tensor> ins{row};
    c.backend_for(group, row).allgather(outs, ins)->wait(c.timeout());
  } catch (const std::exception& e) {
    throw CommError(c.failure_report(
        record, group, "while the ranks compared the collectives they issue: " + error_text(e)));
  }
  std::vector<Fingerprint> ranks;
  for (int r = 0; r < world; ++r) ranks.push_back(decode(all.data_ptr<int64_t>() + r * kFields));
  bool same = true;
  for (const auto& f : ranks) same = same && f.same_collective(mine);
  if (same) return;

  std::ostringstream os;
  os << detail_str(c.rank(), c.world_size()) << "the ranks";
  if (group.impl()->id != 0) os << " of group " << group.describe();
  os << " issued different collectives (this rank's "
     << mine.describe() << "):";
  for (int r = 0; r < world; ++r) {
    os << "\n  rank " << group.global_rank(r) << ": " << ranks[static_cast<size_t>(r)].describe();
  }
  os << "\nEvery rank must issue the same collectives in the same order, with the same element "
        "count, dtype, root and reduce op. Look for a data-dependent branch, a tensor whose "
        "size differs by rank, or a rank that skipped or added a collective. Nothing was sent "
        "(DS_COMM_CHECK_COLLECTIVES=0 turns this check off).";
  throw CommError(os.str());
}

}  // namespace deepspeed::comm::detail
