// Timers implementation: steady_clock on CPU (CUDA builds synchronise before reading).
#include "runtime/timers.h"

#include <cstdio>

namespace deepspeed::runtime {

void Timers::start(const std::string& name) {
  Timer& t = timers_[name];
  t.started = std::chrono::steady_clock::now();
  t.running = true;
}

void Timers::stop(const std::string& name) {
  Timer& t = timers_[name];
  if (!t.running) return;
  t.elapsed_ms +=
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t.started)
          .count();
  t.running = false;
}

void Timers::add(const std::string& name, double ms) { timers_[name].elapsed_ms += ms; }

double Timers::elapsed_ms(const std::string& name) const {
  auto it = timers_.find(name);
  return it == timers_.end() ? 0.0 : it->second.elapsed_ms;
}

void Timers::reset(const std::string& name) {
  auto it = timers_.find(name);
  if (it != timers_.end()) it->second.elapsed_ms = 0.0;
}

std::string Timers::format(const std::vector<std::string>& names) const {
  std::string out = "time (ms)";
  char buf[64];
  for (const auto& n : names) {
    std::snprintf(buf, sizeof(buf), "%.2f", elapsed_ms(n));
    out += " | " + n + ": " + buf;
  }
  return out;
}

}  // namespace deepspeed::runtime
