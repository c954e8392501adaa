// A stream of our own on the training device, for copies that should run beside the compute
// stream (ZeRO-Offload's device-to-host gradient copies), ordered against it by events so that
// the host does not wait unless asked.
//
// Device-generic through c10's stream and event interfaces, so it compiles against the CPU-only
// LibTorch too. The CPU has no streams: there, queued work runs at once on the caller's thread
// and the waits return at once, which keeps the logic built on it testable on CPU machines.
#pragma once

#include <functional>
#include <memory>
#include <optional>

#include <c10/core/Device.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>

namespace deepspeed::runtime {

class SideStream {
 public:
  explicit SideStream(c10::Device device);

  /// Runs `work` with the side stream current, after everything queued so far on the current
  /// stream (the kernels `work` queues read what those wrote).
  void enqueue_after_current(const std::function<void()>& work);
  /// enqueue_after_current, and a mark of that work alone for current_waits_for(); null on the
  /// CPU, where the work is done when this returns.
  using Mark = std::shared_ptr<c10::Event>;
  Mark enqueue_marked(const std::function<void()>& work);
  /// The current stream waits, on the device, for everything queued on the side stream so far
  /// (before it overwrites memory those copies read).
  void current_waits();
  /// The current stream of the mark's device waits for the marked work (null: nothing).
  static void current_waits_for(const Mark& mark);
  /// The host waits for everything queued on the side stream so far.
  void synchronize();

  bool on_device() const { return stream_.has_value(); }

 private:
  c10::Device device_;
  std::optional<c10::Stream> stream_;  // none for the CPU
};

}  // namespace deepspeed::runtime
