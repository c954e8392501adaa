// Recursive removal of a folder, without std::filesystem::remove_all.
//
// A binary built with GCC 12's libstdc++ and run on a machine with a newer one (the GPU machines
// run our Debian-built binaries) crashed inside remove_all (a call through a null pointer);
// nftw is plain libc.
#pragma once

#include <string>

namespace deepspeed::util {

/// Removes `path` and everything under it, not following symbolic links. Best effort: returns
/// false if something could not be removed (or `path` did not exist), never throws.
bool remove_tree(const std::string& path) noexcept;

}  // namespace deepspeed::util
