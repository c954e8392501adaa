// Communicator: rendezvous from the environment, Gloo process group, and the cross-rank record
// of collectives that turns a hang into a report. See docs/comm.md.
#include "comm/communicator.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <optional>
#include <sstream>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef DS_WITH_NCCL
#include <torch/cuda.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include "comm/rendezvous.h"
#include "util/check.h"
#include "util/env.h"
#include "util/logging.h"

namespace deepspeed::comm::detail {
namespace {

constexpr const char* kRecordKeyPrefix = "deepspeed/last_collective/";

// The store key of `rank`'s last collective on group `group_id` (the world keeps the bare key).
std::string record_key(int group_id, int rank) {
  return kRecordKeyPrefix + (group_id == 0 ? std::string() : "g" + std::to_string(group_id) + "/") +
         std::to_string(rank);
}

int env_int_or(const char* name, int fallback) {
  auto v = env::get_int(name);
  return v ? static_cast<int>(*v) : fallback;
}

bool is_loopback(const std::string& addr) {
  return addr == "localhost" || addr.rfind("127.", 0) == 0 || addr == "::1";
}

std::string numeric_host(const sockaddr* sa) {
  char text[INET6_ADDRSTRLEN] = {};
  const void* raw = sa->sa_family == AF_INET
                        ? static_cast<const void*>(&reinterpret_cast<const sockaddr_in*>(sa)->sin_addr)
                        : static_cast<const void*>(&reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr);
  return ::inet_ntop(sa->sa_family, raw, text, sizeof(text)) != nullptr ? text : "";
}

// The local address and interface this machine would use to reach `host`. A connect()ed UDP
// socket sends nothing, but makes the kernel choose the route and the source address; the
// interface holding that address is the one Gloo must bind to on a multi-homed machine (the
// default device binds to whatever the hostname resolves to, which need not reach MASTER_ADDR).
struct RouteChoice {
  std::string address;
  std::string interface;
};

std::optional<RouteChoice> route_to(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return std::nullopt;
  std::optional<RouteChoice> choice;
  for (addrinfo* ai = found; ai != nullptr && !choice; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t length = sizeof(local);
    if (::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) == 0) {
      choice = RouteChoice{numeric_host(reinterpret_cast<sockaddr*>(&local)), ""};
    }
    ::close(fd);
  }
  ::freeaddrinfo(found);
  if (!choice || choice->address.empty()) return std::nullopt;
  ifaddrs* interfaces = nullptr;
  if (::getifaddrs(&interfaces) == 0) {
    for (ifaddrs* i = interfaces; i != nullptr; i = i->ifa_next) {
      if (i->ifa_addr == nullptr || (i->ifa_addr->sa_family != AF_INET && i->ifa_addr->sa_family != AF_INET6)) continue;
      if (numeric_host(i->ifa_addr) == choice->address) {
        choice->interface = i->ifa_name;
        break;
      }
    }
    ::freeifaddrs(interfaces);
  }
  return choice;
}

}  // namespace

std::string CollectiveRecord::describe() const {
  std::ostringstream os;
  os << "#" << seq << " " << name;
  if (!group.empty()) os << " on group " << group;
  os << " (" << numel << " x " << dtype << ", phase " << phase_name(phase) << ")";
  return os.str();
}

std::string CollectiveRecord::encode() const {
  std::ostringstream os;
  os << seq << '|' << name << '|' << numel << '|' << dtype << '|' << static_cast<int>(phase) << '|'
     << group;
  return os.str();
}

CollectiveRecord CollectiveRecord::decode(const std::string& text) {
  CollectiveRecord r;
  std::istringstream is(text);
  std::string field;
  std::vector<std::string> f;
  while (std::getline(is, field, '|')) f.push_back(field);
  if (f.size() == 5 || f.size() == 6) {
    r.seq = std::stoll(f[0]);
    r.name = f[1];
    r.numel = std::stoll(f[2]);
    r.dtype = f[3];
    r.phase = static_cast<Phase>(std::stoi(f[4]));
    if (f.size() == 6) r.group = f[5];
  }
  return r;
}

Communicator& Communicator::instance() {
  static Communicator c;
  return c;
}

void Communicator::init(const InitOptions& o) {
  if (initialized_) return;
  rank_ = o.rank >= 0 ? o.rank : env_int_or("RANK", 0);
  world_size_ = o.world_size >= 0 ? o.world_size : env_int_or("WORLD_SIZE", 1);
  local_rank_ = env_int_or("LOCAL_RANK", rank_);
  local_world_size_ = env_int_or("LOCAL_WORLD_SIZE", env_int_or("LOCAL_SIZE", world_size_));
  DS_CHECK(world_size_ >= 1, CommError, "WORLD_SIZE=", world_size_, " must be >= 1");
  DS_CHECK(rank_ >= 0 && rank_ < world_size_, CommError, "RANK=", rank_,
           " is outside [0, WORLD_SIZE=", world_size_, ")");
  if (o.timeout.count() > 0) {
    timeout_ = o.timeout;
  } else if (auto minutes = env::get_double("DEEPSPEED_TIMEOUT")) {
    timeout_ = std::chrono::milliseconds(static_cast<int64_t>(*minutes * 60000.0));
  }

  std::string addr = !o.master_addr.empty() ? o.master_addr
                                            : env::get("MASTER_ADDR").value_or("127.0.0.1");
  int port = o.master_port >= 0 ? o.master_port : env_int_or("MASTER_PORT", 29500);
  if (world_size_ == 1) {
    store_ = c10::make_intrusive<c10d::HashStore>();
  } else {
    c10d::TCPStoreOptions so;
    so.port = static_cast<uint16_t>(port);
    so.isServer = rank_ == 0;
    so.numWorkers = static_cast<size_t>(world_size_);
    so.waitWorkers = false;  // wait_for_all_ranks below waits, and names who is missing
    so.timeout = timeout_;
    try {
      store_ = c10::make_intrusive<c10d::TCPStore>(addr, so);
    } catch (const std::exception& e) {
      throw CommError(detail_str(rank_, world_size_) + "rendezvous at MASTER_ADDR=" + addr +
                      " MASTER_PORT=" + std::to_string(port) + " failed: " + e.what() +
                      (rank_ == 0 ? " (is the port already in use? pick another --master_port)"
                                  : " (rank 0 serves the store: did it start within the timeout "
                                    "of " + std::to_string(timeout_.count()) +
                                    " ms, and is the address reachable?)"));
    }
    wait_for_all_ranks(*store_, rank_, world_size_, timeout_,
                       "MASTER_ADDR=" + addr + " MASTER_PORT=" + std::to_string(port));
  }

  auto opts = c10d::ProcessGroupGloo::Options::create(timeout_);
  // One line per machine (its local rank 0) says which network Gloo uses. The communicator is not
  // initialized yet, so info_rank0 prints for whichever rank calls it.
  auto log_device = [&](const std::string& what) {
    if (local_rank_ == 0 && world_size_ > 1) {
      log::info_rank0(detail_str(rank_, world_size_) + "Gloo uses " + what);
    }
  };
  if (auto ifname = env::get("GLOO_SOCKET_IFNAME")) {
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(*ifname));
    log_device("interface " + *ifname + " (GLOO_SOCKET_IFNAME)");
  } else if (world_size_ == 1 || is_loopback(addr)) {
    // Single machine: keep Gloo on loopback instead of whatever the hostname resolves to.
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  } else if (auto route = route_to(addr, port)) {
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(route->address));
    log_device("interface " + (route->interface.empty() ? std::string("?") : route->interface) + " (" +
               route->address + "), the route to MASTER_ADDR=" + addr +
               "; set GLOO_SOCKET_IFNAME to choose another");
  } else {
    log::warn("no route to MASTER_ADDR=" + addr + " found; Gloo binds to the address this host's name "
              "resolves to (set GLOO_SOCKET_IFNAME to choose the interface)");
    opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  }
  opts->threads = 2;
  gloo_options_ = opts;
  gloo_ = make_gloo(store_, rank_, world_size_, "the Gloo process group");
#ifdef DS_WITH_NCCL
  if (torch::cuda::is_available()) {
    // NCCL gets its own key space in the shared store, beside Gloo's.
    auto nccl_store = c10::make_intrusive<c10d::PrefixStore>("nccl", store_);
    auto nopts = c10d::ProcessGroupNCCL::Options::create();
    nopts->timeout = timeout_;
    try {
      nccl_ = c10::make_intrusive<c10d::ProcessGroupNCCL>(nccl_store, rank_, world_size_, nopts);
    } catch (const std::exception& e) {
      throw CommError(detail_str(rank_, world_size_) + "creating the NCCL process group failed: " +
                      e.what());
    }
  }
#endif
  initialized_ = true;
  seq_ = 0;
  ++generation_;
  next_group_id_ = 1;
  auto world = std::make_shared<Group::Impl>();
  world->name = "world";
  world->id = 0;
  for (int r = 0; r < world_size_; ++r) world->ranks.push_back(r);
  world->rank = rank_;
  world->generation = generation_;
  world->gloo = gloo_;
  world->nccl = nccl_;
  world_ = Group(std::move(world));
}

c10::intrusive_ptr<compat::CollectiveBackend> Communicator::make_gloo(
    c10::intrusive_ptr<c10d::Store> store, int rank, int size, const std::string& what) {
  try {
    return c10::make_intrusive<c10d::ProcessGroupGloo>(std::move(store), rank, size,
                                                       gloo_options_);
  } catch (const std::exception& e) {
    throw CommError(detail_str(rank_, world_size_) + "creating " + what + " failed: " + e.what());
  }
}

void Communicator::destroy(bool sync) {
  if (!initialized_) return;
  if (sync && world_size_ > 1) {
    try {
      barrier(world_);
    } catch (const std::exception&) {
      // Tearing down after a failure: the peers may be gone already.
    }
  }
  world_ = Group();
  nccl_.reset();
  gloo_.reset();
  store_.reset();
  initialized_ = false;
}

compat::CollectiveBackend& Communicator::backend_for(const Group& group,
                                                     const at::Tensor& tensor) {
  check_usable(group, "a collective");
  Group::Impl& g = *group.impl();
  if (tensor.defined() && tensor.is_cuda()) {
    DS_CHECK(g.nccl, CommError, detail_str(rank_, world_size_),
             "a CUDA tensor was passed to a collective on group ", group.describe(),
             " but this build has no NCCL process group "
             "(build against a CUDA LibTorch with -DDS_BUILD_CUDA=ON)");
    return *g.nccl;
  }
  DS_INTERNAL_ASSERT(g.gloo, "group ", group.describe(), " of size ", group.size(),
                     " has no Gloo process group");
  return *g.gloo;
}

CollectiveRecord Communicator::begin(const char* name, const at::Tensor& tensor,
                                     const Group& group) {
  DS_CHECK(initialized_, CommError, name,
           ": deepspeed::comm is not initialized; call init_distributed() first");
  check_usable(group, name);
  Group::Impl& g = *group.impl();
  CollectiveRecord r;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    r.rank_seq = ++seq_;
    r.seq = ++g.seq;
  }
  r.name = name;
  if (g.id != 0) r.group = group.describe();
  r.numel = tensor.defined() ? tensor.numel() : 0;
  r.dtype = "none";
  if (tensor.defined()) {
    r.dtype = c10::toString(tensor.scalar_type());
    for (auto& ch : r.dtype) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  }
  r.phase = phase;
  if (g.ranks.size() > 1) {
    std::string v = r.encode();
    store_->set(record_key(g.id, rank_), std::vector<uint8_t>(v.begin(), v.end()));
  }
  return r;
}

std::string Communicator::failure_report(const CollectiveRecord& record, const Group& group,
                                         const std::string& error) {
  std::ostringstream os;
  os << detail_str(rank_, world_size_) << "collective " << record.describe() << " failed after "
     << "at most " << timeout_.count() / 1000.0 << " s: " << error;
  const Group::Impl* g = group.impl();
  if (g != nullptr && g->ranks.size() > 1 && store_) {
    std::vector<int> missing;
    std::ostringstream states;
    for (int r : g->ranks) {
      std::string key = record_key(g->id, r);
      CollectiveRecord last;
      bool known = false;
      try {
        if (store_->check({key})) {
          auto bytes = store_->get(key);
          last = CollectiveRecord::decode(std::string(bytes.begin(), bytes.end()));
          known = true;
        }
      } catch (const std::exception&) {
        // The store lives on rank 0; if rank 0 is gone, say so below.
      }
      states << "\n  rank " << r << ": ";
      if (!known) {
        states << "no collective recorded (store unreachable or never started)";
        missing.push_back(r);
      } else {
        states << "last issued " << last.describe();
        if (last.seq < record.seq) missing.push_back(r);
      }
    }
    if (!missing.empty()) {
      os << "\nranks [";
      for (size_t i = 0; i < missing.size(); ++i) os << (i ? ", " : "") << missing[i];
      os << "] never issued collective #" << record.seq << " (" << record.name
         << (g->id != 0 ? " on group " + group.describe() : std::string())
         << "); the other ranks waited for them. Look for a rank that exited, skipped a "
            "step, or ran a different number of batches.";
    } else {
      os << "\nevery rank issued collective #" << record.seq
         << "; check that all ranks pass tensors of the same size and dtype.";
    }
    os << "\nper-rank state:" << states.str();
  }
  return os.str();
}

std::string detail_str(int rank, int world) {
  return "[rank " + std::to_string(rank) + "/" + std::to_string(world) + "] ";
}

}  // namespace deepspeed::comm::detail
