// The engine's checkpoint writer: DeepSpeed's `checkpoint.writer` (its FastPersist checkpoint
// engines) over checkpoint::save.
//
// Note [Decoupled checkpoints]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// With checkpoint.writer.decoupled, save_checkpoint does not wait for the disk. Each file's value
// is snapshot into host memory (value_snapshot.h: one copy of the tensors, taken at save time, so
// training may change the originals at once) and queued for a background thread, which writes
// the files one after the other, each atomically as ever. save_checkpoint returns after the
// snapshots; the checkpoint is committed (every rank's files durable, then `latest` moved, as a
// blocking save does at its end) at the next optimizer step, as DeepSpeed's
// DecoupledCheckpointEngine commits it, or earlier at the next save_checkpoint /
// load_checkpoint or an explicit Engine::commit_decoupled_checkpoint(). Until then `latest`
// names the previous checkpoint, so a crash in between loses only the new one. DeepSpeed's
// engine hands the live tensors to a writer process instead and so must commit before the step
// changes them; the snapshot costs one host copy of the rank's files (the price DeepSpeed pays
// too, moving CPU tensors into shared memory) and keeps the commit point free. A failed write
// surfaces at the commit as a CheckpointError on every rank, naming the file on the rank that
// failed, and `latest` stays where it was.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "deepspeed/checkpoint.h"
#include "deepspeed/config.h"

namespace deepspeed::checkpoint {

class CheckpointWriter {
 public:
  /// `config`: the checkpoint.writer section; nullopt (absent) is the standard writer.
  explicit CheckpointWriter(std::optional<CheckpointWriterConfig> config);
  /// Finishes the queued writes (their files become durable; nothing moves `latest`) and logs,
  /// rather than throws, a failure.
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  /// Writes `value` to `path` as the section says, or (decoupled) snapshots it and queues the
  /// write. Throws CheckpointError on I/O failure of a write made now.
  void save(const c10::IValue& value, const std::string& path);
  /// save() as a checkpoint::FileSaver.
  FileSaver saver();
  /// The same writer without decoupling (DeepSpeed's save_16bit_model commits at once).
  FileSaver immediate_saver();
  bool decoupled() const { return config_ && config_->decoupled; }

  /// What the background thread wrote between two wait()s.
  struct Summary {
    int64_t files = 0;
    int64_t bytes = 0;
    double write_seconds = 0;     // the background thread's time writing
    double snapshot_seconds = 0;  // the callers' time copying values in save()
  };
  /// Blocks until every queued file is durable. Throws CheckpointError with the first failed
  /// write (files queued after it are not written).
  Summary wait();

 private:
  struct Job {
    c10::IValue value;
    std::string path;
  };
  void write_now(const c10::IValue& value, const std::string& path);
  void run();

  std::optional<CheckpointWriterConfig> config_;
  WriteOptions options_;

  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Job> queue_;
  bool busy_ = false;
  bool stopping_ = false;
  std::exception_ptr error_;
  Summary summary_;
  std::thread thread_;  // decoupled only
};

}  // namespace deepspeed::checkpoint
