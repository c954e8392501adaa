// TensorBoard's event-file format, both directions: Event protos (tensorboard/compat/proto/
// event.proto, summary.proto) inside TFRecord framing. The writer side is what TensorBoardMonitor
// appends; the reader side parses files back (tests, tools) and checks every CRC.
//
// TFRecord: uint64 length (little-endian), uint32 masked_crc32c(length bytes), data,
// uint32 masked_crc32c(data). The first record of a file is Event{wall_time,
// file_version: "brain.Event:2"}; each scalar is Event{wall_time, step,
// summary: Summary{value: [Value{tag, simple_value}]}}, as torch's SummaryWriter.add_scalar writes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace deepspeed::monitor::detail {

/// Event and Summary field numbers used here.
constexpr uint32_t kEventWallTime = 1;     // double
constexpr uint32_t kEventStep = 2;         // int64
constexpr uint32_t kEventFileVersion = 3;  // string
constexpr uint32_t kEventSummary = 5;      // Summary
constexpr uint32_t kSummaryValue = 1;      // repeated Summary.Value
constexpr uint32_t kValueTag = 1;          // string
constexpr uint32_t kValueSimpleValue = 2;  // float

constexpr const char* kFileVersion = "brain.Event:2";

/// The serialized Event that opens every file.
std::string encode_file_version_event(double wall_time);
/// One scalar as an Event. Step 0 is omitted on the wire (proto3 default), as protobuf does.
std::string encode_scalar_event(double wall_time, int64_t step, std::string_view tag, float value);
/// `data` in TFRecord framing.
std::string frame_record(std::string_view data);

struct ScalarValue {
  std::string tag;
  float simple_value = 0.0f;
};

/// The parts of an Event this project writes; unknown fields are skipped.
struct EventRecord {
  double wall_time = 0.0;
  int64_t step = 0;
  std::string file_version;
  std::vector<ScalarValue> values;
};

/// Parses every record of an event file's bytes. Throws deepspeed::Error naming `where` and the
/// byte offset on a truncated record, a bad length or data CRC, or a malformed Event.
std::vector<EventRecord> parse_event_records(std::string_view bytes, const std::string& where);
/// Reads and parses the file at `path`.
std::vector<EventRecord> read_event_file(const std::string& path);

}  // namespace deepspeed::monitor::detail
