// DeepSpeed's file names, natural ordering of rank files, and how the optimizer file of a rank is
// found (other bf16 prefix, legacy name).
#include <gtest/gtest.h>

#include "deepspeed/checkpoint.h"
#include "support/expect_throw.h"
#include "support/temp_dir.h"

namespace deepspeed::checkpoint {
namespace {

TEST(Layout, DeepSpeedNames) {
  EXPECT_EQ(default_tag(1000), "global_step1000");
  EXPECT_EQ(tag_directory("ckpt", "global_step5"), "ckpt/global_step5");
  EXPECT_EQ(tag_directory("ckpt/", "t"), "ckpt/t");
  EXPECT_EQ(model_states_file_name(), "mp_rank_00_model_states.pt");
  EXPECT_EQ(model_states_file_name(3), "mp_rank_03_model_states.pt");
  EXPECT_EQ(model_states_file_name(12), "mp_rank_12_model_states.pt");
  EXPECT_EQ(zero3_model_states_file_name(5), "zero_pp_rank_5_mp_rank_00_model_states.pt");
  EXPECT_EQ(zero_optim_states_file_name(7), "zero_pp_rank_7_mp_rank_00_optim_states.pt");
  EXPECT_EQ(zero_optim_states_file_name(0, 1, /*bf16=*/true),
            "bf16_zero_pp_rank_0_mp_rank_01_optim_states.pt");
  EXPECT_THROW_WITH(tag_directory("ckpt", ""), CheckpointError, "tag is empty");
}

TEST(Layout, RankFilesSortNaturallyAndTemporariesAreSkipped) {
  testing::TempDir dir;
  for (int r : {10, 2, 1, 0}) write_file_atomically(dir.file(zero_optim_states_file_name(r)), "x");
  write_file_atomically(dir.file(".zero_pp_rank_3_mp_rank_00_optim_states.pt"), "x");
  write_file_atomically(dir.file(model_states_file_name()), "x");
  auto files = list_files_with_suffix(dir.path(), "_optim_states.pt");
  ASSERT_EQ(files.size(), 4u);
  EXPECT_EQ(files[0], dir.file("zero_pp_rank_0_mp_rank_00_optim_states.pt"));
  EXPECT_EQ(files[2], dir.file("zero_pp_rank_2_mp_rank_00_optim_states.pt"));
  EXPECT_EQ(files[3], dir.file("zero_pp_rank_10_mp_rank_00_optim_states.pt"));
}

TEST(Layout, FindsTheOptimizerFileLikeDeepSpeedsLoader) {
  testing::TempDir dir;
  write_file_atomically(dir.file("bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"), "x");
  write_file_atomically(dir.file("zero_pp_rank_1_mp_rank_00_optim_states.pt"), "x");
  write_file_atomically(dir.file("zero_pp_rank_2_mp_rank_00optim_states.pt"), "x");  // legacy
  EXPECT_EQ(find_zero_optim_states_file(dir.path(), 0, 0, true),
            dir.file("bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"));
  // An fp16 job finds the bf16 file (with a warning), and the reverse.
  EXPECT_EQ(find_zero_optim_states_file(dir.path(), 0, 0, false),
            dir.file("bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"));
  EXPECT_EQ(find_zero_optim_states_file(dir.path(), 1, 0, true),
            dir.file("zero_pp_rank_1_mp_rank_00_optim_states.pt"));
  EXPECT_EQ(find_zero_optim_states_file(dir.path(), 2, 0, false),
            dir.file("zero_pp_rank_2_mp_rank_00optim_states.pt"));
  EXPECT_THROW_WITH(find_zero_optim_states_file(dir.path(), 3, 0, false), CheckpointError,
                    "no ZeRO optimizer file for data-parallel rank 3 (tried "
                    "zero_pp_rank_3_mp_rank_00_optim_states.pt");
}

}  // namespace
}  // namespace deepspeed::checkpoint
