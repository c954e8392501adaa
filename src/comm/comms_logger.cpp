// The comms logger: pending collectives keyed by sequence number, completed ones aggregated per
// (record name, message size) as DeepSpeed's CommsLogger.comms_dict, and the summary tables.
#include "comm/comms_logger.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <mutex>
#include <numeric>
#include <unordered_map>

#include <ATen/ATen.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "deepspeed/comm.h"
#include "deepspeed/comms_logging.h"
#include "monitor/python_float.h"
#include "util/logging.h"

namespace deepspeed::comm {
namespace detail {
namespace {

using Clock = std::chrono::steady_clock;

struct Pending {
  std::string record_name;
  std::string op;
  int64_t bytes = 0;
  int world_size = 1;
  c10::Device device{c10::kCPU};
  Clock::time_point start;
};

struct SizeRecord {
  int64_t count = 0;
  std::vector<double> latencies_ms, algbw_gbps, busbw_gbps;
};

struct OpRecord {
  std::string name;
  std::map<int64_t, SizeRecord> sizes;  // ascending, as DeepSpeed's sorted(...) prints them
};

// Set around log_summary's own collectives: DeepSpeed names its barriers
// "log_summary_barrier", and the straggler all-reduces are not recorded (recording them would
// change the records being summarised).
thread_local const char* tls_record_name = nullptr;
thread_local int tls_suspended = 0;

class CommsLogger {
 public:
  void configure(const CommsLoggerConfig& config) {
    std::lock_guard<std::mutex> lock(mutex_);
    config_ = config;
    enabled_.store(config.enabled, std::memory_order_release);
  }
  CommsLoggerConfig config() {
    std::lock_guard<std::mutex> lock(mutex_);
    return config_;
  }
  bool enabled() const { return enabled_.load(std::memory_order_acquire); }

  void issue(int64_t seq, const char* op, const at::Tensor& tensor, int world_size,
             const std::string& group) {
    if (tls_suspended > 0) return;
    Pending p;
    p.op = op;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      // Matches DeepSpeed's timed_op: profile when prof_all, else only ops named in prof_ops.
      const std::string name = tls_record_name ? std::string(tls_record_name) : p.op;
      if (!config_.prof_all && std::find(config_.prof_ops.begin(), config_.prof_ops.end(), name) ==
                                   config_.prof_ops.end()) {
        return;
      }
      p.record_name = name;
      if (!group.empty()) p.record_name += " (group " + group + ")";
      // DeepSpeed's debug appends the calling Python function; C++ has no portable caller name,
      // so the engine phase that issued the op stands in for it.
      if (config_.debug)
        p.record_name += std::string(" | [Caller Func: ") + phase_name(current_phase()) + "]";
    }
    p.world_size = world_size;
    // A barrier carries no payload (DeepSpeed sizes it 0 bytes) even though it is issued here as
    // an all-reduce of one element.
    if (p.op != "barrier" && tensor.defined()) {
      p.bytes = static_cast<int64_t>(tensor.numel()) * static_cast<int64_t>(tensor.element_size());
      p.device = tensor.device();
    }
    p.start = Clock::now();
    std::lock_guard<std::mutex> lock(mutex_);
    pending_[seq] = std::move(p);
  }

  void complete(int64_t seq) {
    Pending p;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = pending_.find(seq);
      if (it == pending_.end()) return;
      p = std::move(it->second);
      pending_.erase(it);
    }
    if (p.device.is_cuda()) {
      // Work::wait() only orders the current stream after the collective; DeepSpeed
      // synchronizes the device before stopping its timer, and so does this.
      c10::impl::getDeviceGuardImpl(p.device.type())->getStream(p.device).synchronize();
    }
    const double latency_ms =
        std::chrono::duration<double, std::milli>(Clock::now() - p.start).count();
    const Bandwidth bw = calc_bw_log(p.op, p.bytes, latency_ms, p.world_size);
    bool verbose;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      verbose = config_.verbose;
      auto op_it = std::find_if(ops_.begin(), ops_.end(),
                                [&](const OpRecord& r) { return r.name == p.record_name; });
      if (op_it == ops_.end()) {
        ops_.push_back(OpRecord{p.record_name, {}});
        op_it = ops_.end() - 1;
      }
      SizeRecord& s = op_it->sizes[p.bytes];
      s.count += 1;
      s.latencies_ms.push_back(latency_ms);
      s.algbw_gbps.push_back(bw.algbw_gbps);
      s.busbw_gbps.push_back(bw.busbw_gbps);
    }
    if (verbose) {
      char line[512];
      std::snprintf(line, sizeof line,
                    "comm op: %s | time (ms): %.2f | msg size: %s | algbw (Gbps): %.2f | "
                    "busbw (Gbps): %.2f",
                    p.record_name.c_str(), latency_ms, convert_size(p.bytes).c_str(), bw.algbw_gbps,
                    bw.busbw_gbps);
      log::info_rank0(line);
    }
  }

  std::vector<CommsLogEntry> entries() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<CommsLogEntry> out;
    for (const auto& op : ops_) {
      for (const auto& [bytes, s] : op.sizes) {
        out.push_back(
            CommsLogEntry{op.name, bytes, s.count, s.latencies_ms, s.algbw_gbps, s.busbw_gbps});
      }
    }
    return out;
  }

  void reset() {
    std::lock_guard<std::mutex> lock(mutex_);
    ops_.clear();
  }

 private:
  std::atomic<bool> enabled_{false};
  std::mutex mutex_;
  CommsLoggerConfig config_;
  std::unordered_map<int64_t, Pending> pending_;
  std::vector<OpRecord> ops_;  // in the order first seen, as DeepSpeed's dict
};

// Never destroyed: collectives may complete from other threads during static destruction.
CommsLogger& logger() {
  static auto* instance = new CommsLogger();
  return *instance;
}

struct ScopedRecordName {
  explicit ScopedRecordName(const char* name) : previous(tls_record_name) {
    tls_record_name = name;
  }
  ~ScopedRecordName() { tls_record_name = previous; }
  const char* previous;
};

struct ScopedSuspend {
  ScopedSuspend() { ++tls_suspended; }
  ~ScopedSuspend() { --tls_suspended; }
};

// Python's f"{x: <20}": left-aligned, padded to 20 (longer text is not cut).
std::string col(const std::string& text) {
  return text.size() >= 20 ? text : text + std::string(20 - text.size(), ' ');
}
std::string col(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  return col(std::string(buf));
}

// Groups entries by record name, in order, printing the name once before its sizes.
template <typename Row>
void append_rows(std::string& out, const std::vector<CommsLogEntry>& entries, Row row) {
  const std::string* current = nullptr;
  for (const auto& e : entries) {
    if (!current || *current != e.record_name) {
      out += e.record_name + "\n";
      current = &e.record_name;
    }
    out += row(e) + "\n";
  }
}

std::string summary_table(const std::vector<CommsLogEntry>& entries) {
  std::string out = col("Comm. Op") + col("Message Size") + col("Count") +
                    col("Total Latency(ms)") + col("Avg Latency(ms)") + col("tput_avg (Gbps)") +
                    col("busbw_avg (Gbps)") + "\n";
  append_rows(out, entries, [](const CommsLogEntry& e) {
    const double total = std::accumulate(e.latencies_ms.begin(), e.latencies_ms.end(), 0.0);
    return col(" ") + col(convert_size(e.msg_size_bytes)) + col(std::to_string(e.count)) +
           col(total) + col(trim_mean(e.latencies_ms, 0.1)) + col(trim_mean(e.algbw_gbps, 0.1)) +
           col(trim_mean(e.busbw_gbps, 0.1));
  });
  return out;
}

// Every rank all-reduces (MIN) each record's latencies in the same order; the records must
// match across ranks, as in DeepSpeed.
std::string straggler_table(const std::vector<CommsLogEntry>& entries) {
  std::string out =
      "_______________________________\nBreakdown with straggler effect\n"
      "-------------------------------\n";
  out += col("Comm. Op") + col("Message Size") + col("Count") + col("Total comm lat(ms)") +
         col("Total straggler(ms)") + col("Avg comm lat(ms)") + col("Avg straggler(ms)") + "\n";
  ScopedSuspend suspend;
  append_rows(out, entries, [](const CommsLogEntry& e) {
    at::Tensor lats = at::tensor(e.latencies_ms, at::kDouble);
    at::Tensor min_lats = lats.clone();
    all_reduce(min_lats, ReduceOp::kMin);
    at::Tensor straggler = lats - min_lats;
    auto to_vec = [](const at::Tensor& t) {
      return std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
    };
    return col(" ") + col(convert_size(e.msg_size_bytes)) + col(std::to_string(e.count)) +
           col(min_lats.sum().item<double>()) + col(straggler.sum().item<double>()) +
           col(trim_mean(to_vec(min_lats), 0.1)) + col(trim_mean(to_vec(straggler), 0.1));
  });
  return out;
}

}  // namespace

void comms_log_issue(int64_t seq, const char* op, const at::Tensor& tensor, int world_size,
                     const std::string& group) {
  if (!logger().enabled()) return;
  logger().issue(seq, op, tensor, world_size, group);
}

void comms_log_complete(int64_t seq) {
  if (!logger().enabled()) return;
  logger().complete(seq);
}

Bandwidth calc_bw_log(const std::string& op, int64_t size_bytes, double latency_ms,
                      int world_size) {
  if (latency_ms <= 0.0) return {};
  const double n = world_size;
  double size = static_cast<double>(size_bytes);
  double algbw = 0.0, busbw = 0.0;
  if (op == "all_reduce" || op == "all_reduce_coalesced" || op == "inference_all_reduce") {
    algbw = 2.0 * size / latency_ms;
    busbw = size / latency_ms * (2.0 * (n - 1.0) / n);
  } else if (op == "all_gather" || op == "all_gather_into_tensor" || op == "reduce_scatter" ||
             op == "reduce_scatter_tensor" || op == "all_to_all_single") {
    // The message of all_gather is one rank's share; the bandwidths count all n shares.
    if (op == "all_gather" || op == "all_gather_into_tensor") size *= n;
    algbw = size / latency_ms;
    busbw = size / latency_ms * ((n - 1.0) / n);
  } else {
    algbw = busbw = size / latency_ms;
  }
  // bytes per ms -> Gbps
  return {algbw * 8.0 / 1e6, busbw * 8.0 / 1e6};
}

std::string convert_size(int64_t size_bytes) {
  if (size_bytes == 0) return "0B";
  static const char* kNames[] = {"B", "KB", "MB", "GB", "TB", "PB", "EB", "ZB", "YB"};
  int i = 0;
  double p = 1.0;
  while (i < 8 && static_cast<double>(size_bytes) >= p * 1024.0) {
    p *= 1024.0;
    ++i;
  }
  // Python's round(x, 2) rounds the exact binary value, as printf's %.2f does.
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f", static_cast<double>(size_bytes) / p);
  return monitor::detail::python_float_repr(std::strtod(buf, nullptr)) + " " + kNames[i];
}

double trim_mean(std::vector<double> data, double trim_fraction) {
  const size_t n = data.size();
  if (n == 0) return 0.0;
  std::sort(data.begin(), data.end());
  // Python's round() (ties to even), which nearbyint gives in the default rounding mode.
  const auto k = static_cast<size_t>(std::nearbyint(static_cast<double>(n) * trim_fraction));
  if (2 * k >= n) return 0.0;
  return std::accumulate(data.begin() + k, data.end() - k, 0.0) / static_cast<double>(n - 2 * k);
}

}  // namespace detail

void configure_comms_logger(const CommsLoggerConfig& config) { detail::logger().configure(config); }
CommsLoggerConfig comms_logger_config() { return detail::logger().config(); }
std::vector<CommsLogEntry> comms_log_entries() { return detail::logger().entries(); }
void reset_comms_log() { detail::logger().reset(); }

std::string comms_log_summary_string() { return detail::summary_table(comms_log_entries()); }

void log_summary(bool show_straggler) {
  const bool distributed = is_initialized();
  if (distributed) {
    detail::ScopedRecordName name("log_summary_barrier");
    barrier();
  }
  const auto entries = comms_log_entries();
  std::string out = detail::summary_table(entries);
  if (show_straggler && distributed) out += detail::straggler_table(entries);
  if (!distributed || get_rank() == 0) {
    std::fputs(out.c_str(), stdout);
    std::fflush(stdout);
  }
  if (distributed) {
    detail::ScopedRecordName name("log_summary_barrier");
    barrier();
  }
}

}  // namespace deepspeed::comm
