// Typed errors thrown by deepspeed-cpp. The library throws; only main() exits.
// Each message says where (config key path, rank, collective, file), what was expected vs found,
// and what to do. See docs/errors.md for the two-tier rule (DS_CHECK vs DS_INTERNAL_ASSERT).
#pragma once

#include <stdexcept>
#include <string>

namespace deepspeed {

/// Base class of every error deepspeed-cpp throws on purpose.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

/// ds_config.json problems: wrong type, impossible value, unknown key in a strict section.
class ConfigError : public Error {
 public:
  using Error::Error;
};

/// A DeepSpeed feature this build does not implement yet, refused by name.
class NotSupportedError : public Error {
 public:
  using Error::Error;
};

/// Collective / process-group failures, including timeouts with the cross-rank report.
class CommError : public Error {
 public:
  using Error::Error;
};

/// Checkpoint save/load failures (missing files, layout mismatch).
class CheckpointError : public Error {
 public:
  using Error::Error;
};

/// An allocation failed inside the engine (forward, backward, step, initialization). The message
/// names the rank and phase, gives the allocator's own text and the rank's memory ledger (what
/// the engine holds per component, Engine::memory_report), and what to try.
class OutOfMemoryError : public Error {
 public:
  using Error::Error;
};

/// Misuse of the engine API (backward without an optimizer, non-scalar loss, ...).
class UsageError : public Error {
 public:
  using Error::Error;
};

}  // namespace deepspeed
