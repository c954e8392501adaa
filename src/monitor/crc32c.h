// CRC-32C (Castagnoli), the checksum of TFRecord framing, and TensorFlow's "masked" form of it.
// Owns only the checksum; the record layout lives in event_file_writer.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace deepspeed::monitor::detail {

/// CRC-32C of `data` (reflected polynomial 0x82F63B78; crc32c("123456789") == 0xE3069283).
uint32_t crc32c(std::string_view data);

/// TFRecord stores ((crc >> 15) | (crc << 17)) + 0xa282ead8: a CRC of data that itself contains
/// CRCs would otherwise be degenerate (TensorFlow's core/lib/hash/crc32c.h gives the reason).
uint32_t masked_crc32c(std::string_view data);

}  // namespace deepspeed::monitor::detail
