// Whole-file reads and crash-safe writes for the text pipeline (corpus, token cache). Owns the
// temp-file + rename protocol; callers decide what the bytes are.
#pragma once

#include <string>
#include <string_view>

namespace deepspeed::examples {

// Reads the whole file. Throws std::runtime_error naming the path and the OS error.
std::string read_file(const std::string& path);

// True if `path` names an existing regular file (or a link to one).
bool file_exists(const std::string& path);

// Writes `bytes` to a fresh temporary file beside `path` (name unique per process and call),
// flushes it to disk, then renames it over `path`. Readers see the old file or the new one,
// never a partial one, and several processes may write the same path at once (last rename
// wins). Throws std::runtime_error naming the path and the OS error; the temp file is removed.
void write_file_atomically(const std::string& path, std::string_view bytes);

}  // namespace deepspeed::examples
