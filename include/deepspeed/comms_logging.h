// The comms logger: DeepSpeed's `comms_logger` (deepspeed/utils/comms_logging.py) for every
// collective issued through deepspeed::comm. Each completed collective is recorded under its
// name and message size with its latency and algorithmic / bus bandwidth; `verbose` prints one
// line per op on rank 0; log_summary() prints DeepSpeed's table. See docs/observability.md.
//
// Latency runs from issue to completion: a synchronous collective completes before it returns,
// an async one when its Handle::wait() returns (CUDA tensors: after synchronizing the device's
// current stream, as DeepSpeed synchronizes every logged op). Thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "deepspeed/config.h"

namespace deepspeed::comm {

/// Applies the `comms_logger` section (DeepSpeed's deepspeed.comm.configure()); takes effect for
/// collectives issued afterwards. Records already taken are kept.
void configure_comms_logger(const CommsLoggerConfig& config);
/// The configuration in effect (disabled by default).
CommsLoggerConfig comms_logger_config();

/// The records of one (op, message size) pair on this rank. Bandwidths in Gbps (10^9 bit/s).
struct CommsLogEntry {
  std::string record_name;  // op name; with `debug`, "<op> | [Caller Func: <phase>]"
  int64_t msg_size_bytes = 0;
  int64_t count = 0;
  std::vector<double> latencies_ms;
  std::vector<double> algbw_gbps;
  std::vector<double> busbw_gbps;
};

/// This rank's records: ops in the order first seen, each op's sizes ascending.
std::vector<CommsLogEntry> comms_log_entries();
/// Forgets every record (configuration unchanged).
void reset_comms_log();

/// DeepSpeed's table of this rank's records (columns Comm. Op, Message Size, Count,
/// Total Latency(ms), Avg Latency(ms), tput_avg (Gbps), busbw_avg (Gbps); averages are
/// 10%-trimmed means). Issues no collective.
std::string comms_log_summary_string();

/// DeepSpeed's deepspeed.comm.log_summary(): a collective call (every rank must make it). A
/// barrier (recorded as "log_summary_barrier"), then rank 0 prints the table to stdout, then a
/// second barrier. With `show_straggler` the latencies are all-reduced (MIN) across ranks, one
/// all-reduce per (op, size) record, and the table shows per record the total and average of
/// the minimum latency across ranks ("comm lat") and of each rank's excess over it ("wait"),
/// which shows how long ranks waited for the slowest to arrive. Throws CommError when a
/// collective fails.
void log_summary(bool show_straggler = false);

}  // namespace deepspeed::comm
