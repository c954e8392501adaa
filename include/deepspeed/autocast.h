// Autocast in C++: LibTorch keeps autocast's state per thread and device type, behind setters
// whose names changed in LibTorch 2.4. AutocastScope is Python's `with torch.autocast(...)` over
// either API: it saves the state, sets it, counts the nesting, and on exit clears the cast cache
// (the outermost scope) and restores what it found. The engine enters one around each forward
// when the config's `torch_autocast` section is enabled (docs/mixed_precision.md).
#pragma once

#include <optional>

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

namespace deepspeed {

/// Whether autocast is on for `device` (kCPU or kCUDA) in this thread.
bool autocast_enabled(c10::DeviceType device);
/// The dtype autocast casts to on `device` in this thread.
c10::ScalarType autocast_dtype(c10::DeviceType device);
/// torch.autocast's dtype when none is given: fp16 on CUDA, bf16 on the CPU.
c10::ScalarType default_autocast_dtype(c10::DeviceType device);
/// Whether this LibTorch runs `dtype` autocast on `device`. LibTorch 1.x's CPU autocast runs
/// bf16 only (PyTorch warns and disables it for fp16); 2.x also runs fp16 there.
bool autocast_supported(c10::DeviceType device, c10::ScalarType dtype);

/// `with torch.autocast(device_type, dtype, enabled, cache_enabled)`: on for the scope's
/// lifetime in this thread, then restored. Scopes nest; an inner one with enabled=false turns
/// autocast off inside an outer one. Throws UsageError for a device other than the CPU or CUDA,
/// a dtype other than fp16/bf16, or one autocast_supported() refuses.
class AutocastScope {
 public:
  explicit AutocastScope(c10::DeviceType device,
                         std::optional<c10::ScalarType> dtype = std::nullopt, bool enabled = true,
                         bool cache_enabled = true);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  c10::DeviceType device_;
  bool previous_enabled_;
  c10::ScalarType previous_dtype_;
  bool previous_cache_enabled_;
};

}  // namespace deepspeed
