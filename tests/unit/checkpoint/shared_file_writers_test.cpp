// Who writes a pipeline stage's layer files among its data-parallel replicas: the first replica
// all of them, or with checkpoint.parallel_write.pipeline_stage each its partition_uniform
// share (DeepSpeed's PipelineModule.save_state_dict).
#include <gtest/gtest.h>

#include "runtime/checkpoint/shared_file_writers.h"

namespace deepspeed::checkpoint {
namespace {

using FileRun = std::pair<int, int>;

TEST(SharedFilesToWrite, TheFirstWriterWritesEveryFileWithoutParallelWrite) {
  const std::vector<int> writers = {4, 6};
  EXPECT_EQ(shared_files_to_write(9, writers, 4, false), FileRun(0, 9));
  EXPECT_EQ(shared_files_to_write(9, writers, 6, false), FileRun(9, 9));
  EXPECT_EQ(shared_files_to_write(9, writers, 5, false), FileRun(9, 9));  // not a writer
}

TEST(SharedFilesToWrite, ParallelWriteSplitsTheFilesAsPartitionUniform) {
  // DeepSpeed's example: 9 layers over 2 replicas, the first 5 and the last 4.
  const std::vector<int> two = {4, 6};
  EXPECT_EQ(shared_files_to_write(9, two, 4, true), FileRun(0, 5));
  EXPECT_EQ(shared_files_to_write(9, two, 6, true), FileRun(5, 9));
  // Fewer files than writers: one each, the last writers none.
  const std::vector<int> three = {0, 1, 2};
  EXPECT_EQ(shared_files_to_write(2, three, 0, true), FileRun(0, 1));
  EXPECT_EQ(shared_files_to_write(2, three, 1, true), FileRun(1, 2));
  EXPECT_EQ(shared_files_to_write(2, three, 2, true), FileRun(2, 2));
  EXPECT_EQ(shared_files_to_write(2, three, 3, true), FileRun(2, 2));  // not a writer
}

}  // namespace
}  // namespace deepspeed::checkpoint
