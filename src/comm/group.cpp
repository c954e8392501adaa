// comm::Group: the world group, sub-groups made by new_group(), and the checks that a group can
// run a collective on this rank. See docs/comm.md ("Groups").
#include <algorithm>
#include <set>
#include <sstream>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#ifdef DS_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include "comm/communicator.h"
#include "util/check.h"

namespace deepspeed::comm {
namespace {

const std::vector<int>& no_ranks() {
  static const std::vector<int> empty;
  return empty;
}

const std::string& no_name() {
  static const std::string empty;
  return empty;
}

std::string list_str(const std::vector<int>& ranks) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < ranks.size(); ++i) os << (i ? ", " : "") << ranks[i];
  os << "]";
  return os.str();
}

// For messages and the per-collective record in the store: long groups are abbreviated.
std::string short_list_str(const std::vector<int>& ranks) {
  constexpr size_t kShown = 8;
  if (ranks.size() <= kShown) return list_str(ranks);
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i + 1 < kShown; ++i) os << ranks[i] << ", ";
  os << "..., " << ranks.back() << "]";
  return os.str();
}

}  // namespace

bool Group::is_member() const { return impl_ && impl_->rank >= 0; }
int Group::rank() const { return impl_ ? impl_->rank : -1; }
int Group::size() const { return impl_ ? static_cast<int>(impl_->ranks.size()) : 0; }
const std::vector<int>& Group::ranks() const { return impl_ ? impl_->ranks : no_ranks(); }
const std::string& Group::name() const { return impl_ ? impl_->name : no_name(); }

int Group::group_rank(int global_rank) const {
  const auto& rs = ranks();
  auto it = std::find(rs.begin(), rs.end(), global_rank);
  return it == rs.end() ? -1 : static_cast<int>(it - rs.begin());
}

int Group::global_rank(int group_rank) const {
  DS_CHECK(group_rank >= 0 && group_rank < size(), UsageError, "group ", describe(),
           " has no group rank ", group_rank);
  return ranks()[static_cast<size_t>(group_rank)];
}

std::string Group::describe() const {
  if (!impl_) return "<empty group>";
  return impl_->name + "(" + std::to_string(size()) + ") " + short_list_str(impl_->ranks);
}

Group world() { return detail::Communicator::instance().world(); }

Group new_group(std::vector<int> ranks, const std::string& name) {
  return detail::Communicator::instance().new_group(std::move(ranks), name);
}

Group self_group(const std::string& name) {
  return detail::Communicator::instance().self_group(name);
}

namespace detail {

void Communicator::check_usable(const Group& group, const char* collective) const {
  DS_CHECK(initialized_, UsageError, collective,
           ": deepspeed::comm is not initialized; call deepspeed::comm::init_distributed() or "
           "deepspeed::initialize() first");
  DS_CHECK(group.valid(), UsageError, detail_str(rank_, world_size_), collective,
           " on an empty comm::Group; pass comm::world() or a group from new_group()");
  DS_CHECK(group.impl()->generation == generation_, UsageError, detail_str(rank_, world_size_),
           collective, " on group ", group.describe(),
           ", which was created before destroy_process_group(); create the groups again");
  DS_CHECK(group.is_member(), UsageError, detail_str(rank_, world_size_), collective,
           " on group ", group.describe(), ": rank ", rank_,
           " is not a member; only the group's ranks may call its collectives");
}

Group Communicator::self_group(const std::string& name) const {
  DS_CHECK(initialized_, UsageError, "self_group('", name,
           "'): deepspeed::comm is not initialized; call init_distributed() first");
  auto g = std::make_shared<Group::Impl>();
  g->name = name;
  g->id = -1;  // never used for store keys: a group of one issues nothing
  g->ranks = {rank_};
  g->rank = 0;
  g->generation = generation_;
  return Group(std::move(g));
}

Group Communicator::new_group(std::vector<int> ranks, const std::string& name) {
  DS_CHECK(initialized_, UsageError, "new_group('", name,
           "'): deepspeed::comm is not initialized; call init_distributed() first");
  DS_CHECK(!ranks.empty(), UsageError, detail_str(rank_, world_size_), "new_group('", name,
           "'): the rank list is empty");
  std::set<int> seen;
  for (int r : ranks) {
    DS_CHECK(r >= 0 && r < world_size_, UsageError, detail_str(rank_, world_size_), "new_group('",
             name, "', ", list_str(ranks), "): rank ", r, " is outside the world [0, ",
             world_size_, ")");
    DS_CHECK(seen.insert(r).second, UsageError, detail_str(rank_, world_size_), "new_group('",
             name, "', ", list_str(ranks), "): rank ", r, " is listed twice");
  }
  auto g = std::make_shared<Group::Impl>();
  g->name = name;
  g->id = next_group_id_++;  // every rank counts every call, so ids agree
  g->ranks = std::move(ranks);
  g->generation = generation_;
  const auto it = std::find(g->ranks.begin(), g->ranks.end(), rank_);
  g->rank = it == g->ranks.end() ? -1 : static_cast<int>(it - g->ranks.begin());
  if (g->rank < 0 || g->ranks.size() == 1) return Group(std::move(g));

  check_group_agreement(*g);
  const int size = static_cast<int>(g->ranks.size());
  const std::string prefix = "deepspeed/group/" + std::to_string(g->id);
  g->gloo = make_gloo(c10::make_intrusive<c10d::PrefixStore>(prefix, store_), g->rank, size,
                      "the Gloo process group of group " + Group(g).describe());
#ifdef DS_WITH_NCCL
  if (nccl_) {
    auto nopts = c10d::ProcessGroupNCCL::Options::create();
    nopts->timeout = timeout_;
    try {
      g->nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(
          c10::make_intrusive<c10d::PrefixStore>(prefix + "/nccl", store_), g->rank, size, nopts);
    } catch (const std::exception& e) {
      throw CommError(detail_str(rank_, world_size_) + "creating the NCCL process group of group " +
                      Group(g).describe() + " failed: " + e.what());
    }
  }
#endif
  return Group(std::move(g));
}

void Communicator::check_group_agreement(const Group::Impl& g) {
  // The first member publishes the group as it sees it; the others compare. A rank that called
  // new_group in another order (or with other ranks) fails here, naming both views, instead of
  // waiting in Gloo's connection setup until the timeout.
  const std::string key = "deepspeed/group/" + std::to_string(g.id) + "/spec";
  std::string mine = g.name + " " + list_str(g.ranks);
  if (g.rank == 0) {
    store_->set(key, std::vector<uint8_t>(mine.begin(), mine.end()));
    return;
  }
  std::vector<uint8_t> bytes;
  try {
    bytes = store_->get(key);
  } catch (const std::exception& e) {
    throw CommError(detail_str(rank_, world_size_) + "new_group call #" + std::to_string(g.id) +
                    " (" + mine + "): rank " + std::to_string(g.ranks.front()) +
                    ", its first member, never created it: " + e.what() +
                    "; every rank must call new_group with the same arguments in the same order");
  }
  const std::string theirs(bytes.begin(), bytes.end());
  DS_CHECK(theirs == mine, CommError, detail_str(rank_, world_size_), "new_group call #", g.id,
           ": this rank creates ", mine, " but rank ", g.ranks.front(), " created ", theirs,
           "; every rank must call new_group with the same arguments in the same order");
}

}  // namespace detail
}  // namespace deepspeed::comm
