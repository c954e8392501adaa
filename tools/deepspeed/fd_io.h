// Whole-buffer writes to a file descriptor. The launcher writes every complete line with one call
// so that lines from different ranks (and the launcher's own messages) never interleave mid-line.
#pragma once

#include <string_view>

namespace deepspeed::launcher {

// Writes all of `data` to `fd`, retrying on EINTR and waiting out EAGAIN (a non-blocking fd
// inherited from the caller). Returns false on any other error (EPIPE when the reader went away);
// the caller decides whether that matters. Never raises SIGPIPE if the caller ignores it.
bool write_all(int fd, std::string_view data);

}  // namespace deepspeed::launcher
