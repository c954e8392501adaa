// SwapFolderLock: one job per swap folder. Swap files are named by sub-group and rank alone
// (<nvme_path>/zero_stage_3/.../rank<R>/<id>_<name>.tensor.swp), so two jobs given the same
// nvme_path would overwrite each other's files and train on each other's optimizer states. Each
// swapper holds an flock() on <folder>/deepspeed_swap.lock for its lifetime; a second holder
// fails at once, naming the path and the holder. The kernel drops an flock when its process
// dies, so a lock file left by a crashed job never blocks the next one.
#pragma once

#include <string>

namespace deepspeed::runtime::swap {

class SwapFolderLock {
 public:
  /// Locks `folder` (which must exist). `config_key` names the setting to change in the message
  /// (e.g. "zero_optimization.offload_optimizer.nvme_path") and `nvme_path` its value. Throws
  /// ConfigError "nvme_path X is in use by another job (pid P on host H, lock file F) ..." when
  /// another open lock holds it (another process, or another swapper of this process), and
  /// aio::AioError when the lock file cannot be created.
  SwapFolderLock(const std::string& folder, const std::string& config_key,
                 const std::string& nvme_path);
  /// Removes the lock file and releases the lock.
  ~SwapFolderLock();
  SwapFolderLock(const SwapFolderLock&) = delete;
  SwapFolderLock& operator=(const SwapFolderLock&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace deepspeed::runtime::swap
