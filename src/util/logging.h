// Minimal leveled logging: info lines from global rank 0 only (DeepSpeed prints progress once,
// not once per rank); warnings from every rank, prefixed with the rank.
#pragma once

#include <string>

namespace deepspeed::log {

/// Prints "[deepspeed] msg" on rank 0 to stdout.
void info_rank0(const std::string& msg);
/// Prints "[deepspeed] [rank R] msg" on every rank to stdout (facts each rank has its own of).
void info(const std::string& msg);
/// Prints "[deepspeed] [rank R] warning: msg" to stderr on every rank.
void warn(const std::string& msg);
/// Prints "[deepspeed] warning: msg" on rank 0 to stderr.
void warn_rank0(const std::string& msg);

}  // namespace deepspeed::log
