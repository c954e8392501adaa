// TensorBoard event encoding: CRC-32C known answers, byte-exact Event encoding (derived by hand
// from event.proto / summary.proto), TFRecord framing, and the reader's CRC checks.
#include "monitor/event_file_format.h"

#include <gtest/gtest.h>

#include "deepspeed/errors.h"
#include "monitor/crc32c.h"
#include "support/expect_throw.h"

namespace deepspeed::monitor::detail {
namespace {

std::string bytes(std::initializer_list<int> b) {
  std::string s;
  for (int x : b) s.push_back(static_cast<char>(x));
  return s;
}

TEST(Crc32c, KnownAnswers) {
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);  // the CRC-32C check value
  EXPECT_EQ(crc32c(""), 0u);
  EXPECT_EQ(crc32c(std::string(32, '\0')), 0x8A9136AAu);    // RFC 3720 B.4: 32 bytes of zeros
  EXPECT_EQ(crc32c(std::string(32, '\xff')), 0x62A8AB43u);  // RFC 3720 B.4: 32 bytes of 0xff
  const uint32_t c = crc32c("123456789");
  EXPECT_EQ(masked_crc32c("123456789"), ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

TEST(EventFileFormat, ScalarEventBytesMatchTheProtoWireFormat) {
  // Event{wall_time: 1.0, step: 5, summary {value {tag: "x", simple_value: 1.0}}}
  const std::string value = bytes({0x0A, 0x01, 'x', 0x15, 0x00, 0x00, 0x80, 0x3F});
  const std::string summary = bytes({0x0A, 0x08}) + value;
  const std::string expected =
      bytes({0x09, 0, 0, 0, 0, 0, 0, 0xF0, 0x3F, 0x10, 0x05, 0x2A, 0x0A}) + summary;
  EXPECT_EQ(encode_scalar_event(1.0, 5, "x", 1.0f), expected);
  // Step 0 is a proto3 default and is left out; a 300 step is a two-byte varint.
  EXPECT_EQ(encode_scalar_event(1.0, 0, "x", 1.0f).find(bytes({0x10})), std::string::npos);
  EXPECT_NE(encode_scalar_event(1.0, 300, "x", 1.0f).find(bytes({0x10, 0xAC, 0x02})),
            std::string::npos);
}

TEST(EventFileFormat, FileVersionEvent) {
  const std::string e = encode_file_version_event(2.0);
  EXPECT_EQ(e, bytes({0x09, 0, 0, 0, 0, 0, 0, 0, 0x40, 0x1A, 13}) + "brain.Event:2");
}

TEST(EventFileFormat, FramedRecordsRoundTrip) {
  std::string file = frame_record(encode_file_version_event(10.5));
  file += frame_record(encode_scalar_event(11.0, 7, "Train/Samples/lr", 0.25f));
  file += frame_record(encode_scalar_event(12.0, -3, "neg", -1.5f));
  // uint64 little-endian length of the first Event (9 + 2 + 13 bytes).
  EXPECT_EQ(file.substr(0, 8), bytes({24, 0, 0, 0, 0, 0, 0, 0}));
  const auto events = parse_event_records(file, "mem");
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].file_version, "brain.Event:2");
  EXPECT_DOUBLE_EQ(events[0].wall_time, 10.5);
  EXPECT_TRUE(events[0].values.empty());
  EXPECT_EQ(events[1].step, 7);
  ASSERT_EQ(events[1].values.size(), 1u);
  EXPECT_EQ(events[1].values[0].tag, "Train/Samples/lr");
  EXPECT_EQ(events[1].values[0].simple_value, 0.25f);
  EXPECT_EQ(events[2].step, -3);
  EXPECT_EQ(events[2].values[0].simple_value, -1.5f);
}

TEST(EventFileFormat, ReaderRejectsCorruption) {
  const std::string good = frame_record(encode_scalar_event(1.0, 1, "a", 2.0f));
  std::string bad_data = good;
  bad_data[14] ^= 0x01;  // inside the Event bytes
  EXPECT_THROW_WITH(parse_event_records(bad_data, "f"), deepspeed::Error, "data CRC mismatch");
  std::string bad_length = good;
  bad_length[0] ^= 0x01;
  EXPECT_THROW_WITH(parse_event_records(bad_length, "f"), deepspeed::Error, "length CRC mismatch");
  EXPECT_THROW_WITH(parse_event_records(good.substr(0, good.size() - 2), "f"), deepspeed::Error,
                    "truncated");
  EXPECT_THROW_WITH(parse_event_records(good.substr(0, 5), "f"), deepspeed::Error,
                    "truncated record header");
}

}  // namespace
}  // namespace deepspeed::monitor::detail
