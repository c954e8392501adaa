// AutocastScope over LibTorch's autocast state (see the header). LibTorch 2.4 replaced the
// per-device setters (set_cpu_enabled, set_autocast_gpu_dtype, ...) by ones taking the device
// type; the old names remain as deprecated wrappers for a while, so the new ones are used where
// they exist.
#include "deepspeed/autocast.h"

#include <ATen/autocast_mode.h>
#include <torch/version.h>

#include "util/check.h"

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
#define DS_AUTOCAST_BY_DEVICE_TYPE 1
#else
#define DS_AUTOCAST_BY_DEVICE_TYPE 0
#endif

namespace deepspeed {
namespace {

void check_device(c10::DeviceType device) {
  DS_CHECK(device == c10::DeviceType::CPU || device == c10::DeviceType::CUDA, UsageError,
           "autocast: device type ", device, " is not supported (the CPU or CUDA)");
}

void set_enabled(c10::DeviceType device, bool on) {
#if DS_AUTOCAST_BY_DEVICE_TYPE
  at::autocast::set_autocast_enabled(device, on);
#else
  if (device == c10::DeviceType::CPU) {
    at::autocast::set_cpu_enabled(on);
  } else {
    at::autocast::set_enabled(on);
  }
#endif
}

void set_dtype(c10::DeviceType device, c10::ScalarType dtype) {
#if DS_AUTOCAST_BY_DEVICE_TYPE
  at::autocast::set_autocast_dtype(device, dtype);
#else
  if (device == c10::DeviceType::CPU) {
    at::autocast::set_autocast_cpu_dtype(dtype);
  } else {
    at::autocast::set_autocast_gpu_dtype(dtype);
  }
#endif
}

}  // namespace

bool autocast_enabled(c10::DeviceType device) {
  check_device(device);
#if DS_AUTOCAST_BY_DEVICE_TYPE
  return at::autocast::is_autocast_enabled(device);
#else
  return device == c10::DeviceType::CPU ? at::autocast::is_cpu_enabled()
                                        : at::autocast::is_enabled();
#endif
}

c10::ScalarType autocast_dtype(c10::DeviceType device) {
  check_device(device);
#if DS_AUTOCAST_BY_DEVICE_TYPE
  return at::autocast::get_autocast_dtype(device);
#else
  return device == c10::DeviceType::CPU ? at::autocast::get_autocast_cpu_dtype()
                                        : at::autocast::get_autocast_gpu_dtype();
#endif
}

c10::ScalarType default_autocast_dtype(c10::DeviceType device) {
  check_device(device);
  return device == c10::DeviceType::CPU ? c10::kBFloat16 : c10::kHalf;
}

bool autocast_supported(c10::DeviceType device, c10::ScalarType dtype) {
  if (dtype != c10::kHalf && dtype != c10::kBFloat16) return false;
  if (device == c10::DeviceType::CUDA) return true;
  return device == c10::DeviceType::CPU && (dtype == c10::kBFloat16 || TORCH_VERSION_MAJOR >= 2);
}

AutocastScope::AutocastScope(c10::DeviceType device, std::optional<c10::ScalarType> dtype,
                             bool enabled, bool cache_enabled)
    : device_(device),
      previous_enabled_(autocast_enabled(device)),
      previous_dtype_(autocast_dtype(device)),
      previous_cache_enabled_(at::autocast::is_autocast_cache_enabled()) {
  const c10::ScalarType target = dtype.value_or(default_autocast_dtype(device));
  if (enabled) {
    DS_CHECK(target == c10::kHalf || target == c10::kBFloat16, UsageError,
             "autocast: dtype ", target, " is not a lower precision (fp16 or bf16)");
    DS_CHECK(autocast_supported(device, target), UsageError, "autocast: this LibTorch (",
             TORCH_VERSION, ") has no ", target, " autocast on ", device,
             "; its CPU autocast runs BFloat16 only (LibTorch 2.x adds Half)");
  }
  // Matches torch.autocast.__enter__: state first, then the nesting count.
  set_enabled(device_, enabled);
  set_dtype(device_, target);
  at::autocast::set_autocast_cache_enabled(cache_enabled);
  at::autocast::increment_nesting();
}

AutocastScope::~AutocastScope() {
  // Matches torch.autocast.__exit__: the outermost scope drops the cached casts of the weights.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  set_enabled(device_, previous_enabled_);
  set_dtype(device_, previous_dtype_);
  at::autocast::set_autocast_cache_enabled(previous_cache_enabled_);
}

}  // namespace deepspeed
