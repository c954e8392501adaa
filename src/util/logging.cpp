// Logging implementation: line-at-a-time writes so the launcher's rank prefixes stay intact.
#include "util/logging.h"

#include <cstdio>

#include "deepspeed/comm.h"

namespace deepspeed::log {

void info_rank0(const std::string& msg) {
  if (comm::is_initialized() && comm::get_rank() != 0) return;
  std::fprintf(stdout, "[deepspeed] %s\n", msg.c_str());
  std::fflush(stdout);
}

void info(const std::string& msg) {
  int rank = comm::is_initialized() ? comm::get_rank() : 0;
  std::fprintf(stdout, "[deepspeed] [rank %d] %s\n", rank, msg.c_str());
  std::fflush(stdout);
}

void warn(const std::string& msg) {
  int rank = comm::is_initialized() ? comm::get_rank() : 0;
  std::fprintf(stderr, "[deepspeed] [rank %d] warning: %s\n", rank, msg.c_str());
  std::fflush(stderr);
}

void warn_rank0(const std::string& msg) {
  if (comm::is_initialized() && comm::get_rank() != 0) return;
  std::fprintf(stderr, "[deepspeed] warning: %s\n", msg.c_str());
  std::fflush(stderr);
}

}  // namespace deepspeed::log
