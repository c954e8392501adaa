// Which ranks write the checkpoint files that data-parallel replicas share.
//
// Note [Node-local checkpoint storage]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Replicas of the same model-parallel rank hold the same model states, a pipeline stage's
// replicas the same layer files, an expert's data-parallel replicas the same expert. By default
// one of them writes such a file (the first, as DeepSpeed's save_non_zero_checkpoint) into a
// save_dir that every node sees. With checkpoint.use_node_local_storage each node saves into its
// own disk, so the first replica ON EACH NODE writes it, `latest` and the tag directory are each
// node's local rank 0's, and every node's folder can resume that node's ranks on its own.
// DeepSpeed picks local rank 0 alone, which drops the files of the other model-parallel ranks
// of a node; here every model-parallel rank has its writer on every node.
//
// A node's ranks are the contiguous global ranks [RANK - LOCAL_RANK, that + LOCAL_WORLD_SIZE),
// as every launcher (ours, DeepSpeed's, torchrun) assigns them; so this needs no collective and
// may run inside a save's all-ranks-or-none section.
#pragma once

#include <utility>
#include <vector>

#include "deepspeed/comm.h"

namespace deepspeed::checkpoint {

/// The members of `replicas` (global ranks, in group order) among which the files they share
/// are written: all of them, or with `node_local` those on this rank's node.
std::vector<int> shared_file_writers(const comm::Group& replicas, bool node_local);

/// Whether this rank writes the files `replicas` share on its own: the first of
/// shared_file_writers.
bool writes_shared_files(const comm::Group& replicas, bool node_local);

/// The run [first, last) of `count` shared files (a pipeline stage's layer files) that global
/// rank `rank` writes among `writers`: all for the first writer and none for the others, or
/// with `split` (checkpoint.parallel_write.pipeline_stage) each writer its partition_uniform
/// share. Ranks that are not writers write none.
std::pair<int, int> shared_files_to_write(int count, const std::vector<int>& writers, int rank,
                                          bool split);

}  // namespace deepspeed::checkpoint
