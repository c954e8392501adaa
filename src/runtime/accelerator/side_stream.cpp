// See side_stream.h.
#include "runtime/accelerator/side_stream.h"

#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

namespace deepspeed::runtime {
namespace {

c10::Stream current_stream(const c10::Device& device) {
  return c10::impl::getDeviceGuardImpl(device.type())->getStream(device);
}

// `waiter` waits, on the device, for the work queued on `done` so far.
void order_after(const c10::Stream& done, const c10::Stream& waiter) {
  c10::Event event(done.device_type());
  event.record(done);
  event.block(waiter);
}

}  // namespace

SideStream::SideStream(c10::Device device) : device_(device) {
  if (device.is_cpu()) return;
  stream_ = c10::impl::getDeviceGuardImpl(device.type())->getStreamFromGlobalPool(device);
}

void SideStream::enqueue_after_current(const std::function<void()>& work) {
  if (!stream_) return work();
  order_after(current_stream(device_), *stream_);
  c10::StreamGuard guard(*stream_);
  work();
}

SideStream::Mark SideStream::enqueue_marked(const std::function<void()>& work) {
  enqueue_after_current(work);
  if (!stream_) return nullptr;
  auto mark = std::make_shared<c10::Event>(stream_->device_type());
  mark->record(*stream_);
  return mark;
}

void SideStream::current_waits_for(const Mark& mark) {
  if (mark) mark->block(current_stream(mark->device()));
}

void SideStream::current_waits() {
  if (stream_) order_after(*stream_, current_stream(device_));
}

void SideStream::synchronize() {
  if (stream_) stream_->synchronize();
}

}  // namespace deepspeed::runtime
