// Timers: DeepSpeed's wall-clock breakdown. Micro timers (fwd_microstep, ...) cover one
// micro-step; global timers (fwd, bwd, ...) accumulate over the micro-steps of one optimizer step.
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace deepspeed::runtime {

class Timers {
 public:
  void start(const std::string& name);
  void stop(const std::string& name);
  /// Adds `ms` to a timer without start/stop (e.g. time measured elsewhere).
  void add(const std::string& name, double ms);
  double elapsed_ms(const std::string& name) const;
  void reset(const std::string& name);
  /// "time (ms) | a: 1.23 | b: 4.56" over `names`, in that order.
  std::string format(const std::vector<std::string>& names) const;

 private:
  struct Timer {
    std::chrono::steady_clock::time_point started;
    bool running = false;
    double elapsed_ms = 0.0;
  };
  std::map<std::string, Timer> timers_;
};

}  // namespace deepspeed::runtime
