// wait_all(): waits for every transfer a handle has in flight and returns the failure instead of
// throwing it, for the swappers' settle steps (which must put every buffer back whatever
// happened before they report) and their clean-up after a failed start.
#pragma once

#include <optional>

#include "deepspeed/aio.h"

namespace deepspeed::runtime::swap {

inline std::optional<aio::AioError> wait_all(aio::AioHandle& handle) {
  try {
    handle.wait();
  } catch (const aio::AioError& e) {
    return e;
  }
  return std::nullopt;
}

}  // namespace deepspeed::runtime::swap
