// See remove_tree.h.
#include "util/remove_tree.h"

#include <ftw.h>
#include <stdio.h>

namespace deepspeed::util {
namespace {

int remove_entry(const char* path, const struct stat*, int, struct FTW*) {
  return ::remove(path) == 0 ? 0 : -1;
}

}  // namespace

bool remove_tree(const std::string& path) noexcept {
  // Depth first (contents before their folder), physical (links removed, not followed).
  return ::nftw(path.c_str(), remove_entry, 32, FTW_DEPTH | FTW_PHYS) == 0;
}

}  // namespace deepspeed::util
