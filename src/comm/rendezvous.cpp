// Rendezvous check-in and the report of ranks that never arrived (see rendezvous.h).
#include "comm/rendezvous.h"

#include <unistd.h>

#include <sstream>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "util/check.h"

namespace deepspeed::comm::detail {
namespace {

constexpr const char* kArrivedKeyPrefix = "deepspeed/rendezvous/rank/";
// The fast poll asks once whether everybody is there; who exactly is refreshed less often (one
// request per missing rank), so that the report stays current without flooding rank 0's store.
constexpr auto kPollInterval = std::chrono::milliseconds(20);
constexpr auto kRefreshInterval = std::chrono::milliseconds(500);

std::string arrived_key(int r) { return kArrivedKeyPrefix + std::to_string(r); }

std::string host_and_pid() {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) host[0] = '?';
  return std::string(host) + " pid " + std::to_string(::getpid());
}

std::string text_of(const std::vector<uint8_t>& bytes) { return std::string(bytes.begin(), bytes.end()); }

}  // namespace

void wait_for_all_ranks(c10d::Store& store, int rank, int world, std::chrono::milliseconds timeout,
                        const std::string& master) {
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + timeout;
  const std::string me = host_and_pid();
  store.set(arrived_key(rank), std::vector<uint8_t>(me.begin(), me.end()));

  std::vector<std::string> all_keys;
  for (int r = 0; r < world; ++r) all_keys.push_back(arrived_key(r));
  std::vector<std::string> where(static_cast<size_t>(world));  // "" until seen
  where[static_cast<size_t>(rank)] = me;
  auto refresh = [&] {
    for (int r = 0; r < world; ++r) {
      auto& w = where[static_cast<size_t>(r)];
      if (w.empty() && store.check({arrived_key(r)})) w = text_of(store.get(arrived_key(r)));
    }
  };
  std::string store_error;
  auto last_refresh = start;
  try {
    for (;;) {
      if (store.check(all_keys)) return;
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) {
        refresh();
        break;
      }
      if (now - last_refresh >= kRefreshInterval) {
        refresh();
        last_refresh = now;
      }
      std::this_thread::sleep_for(kPollInterval);
    }
  } catch (const std::exception& e) {
    store_error = e.what();
    store_error = store_error.substr(0, store_error.find('\n'));
  }
  std::vector<int> missing;
  for (int r = 0; r < world; ++r) {
    if (where[static_cast<size_t>(r)].empty()) missing.push_back(r);
  }

  std::ostringstream os;
  os << detail_str(rank, world) << "rendezvous at " << master << ": ";
  if (missing.empty()) {
    os << "every rank arrived, but ";
  } else {
    os << "rank" << (missing.size() > 1 ? "s " : " ");
    for (size_t i = 0; i < missing.size(); ++i) os << (i ? ", " : "") << missing[i];
    os << " of " << world << " never arrived within the timeout of " << timeout.count() / 1000.0
       << " s";
  }
  if (!store_error.empty()) {
    os << (missing.empty() ? "" : "; then ") << "the store served by rank 0 at " << master
       << " failed (" << store_error << "): rank 0 gave up or exited";
  }
  os << ". Arrived:";
  for (int r = 0; r < world; ++r) {
    if (!where[static_cast<size_t>(r)].empty()) os << "\n  rank " << r << ": " << where[static_cast<size_t>(r)];
  }
  os << "\nStart every rank of the job (WORLD_SIZE=" << world
     << "), and look for a rank that exited or crashed before init_distributed; "
        "DEEPSPEED_TIMEOUT (minutes) sets the timeout.";
  throw CommError(os.str());
}

}  // namespace deepspeed::comm::detail
