// consolidate_zero_checkpoint: ZeRO-2 checkpoints of 1-4 ranks (padding, an all-padding rank,
// frozen params, buffers, a tied weight) give back the original tensors exactly, including the
// engine's own FlatGroup layout (round-robin order); ZeRO-3 files as Python DeepSpeed writes
// them; and broken checkpoints fail naming the file.
#include <unistd.h>

#include <fstream>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "deepspeed/checkpoint.h"
#include "deepspeed/universal_checkpoint.h"
#include "runtime/zero/flat_group.h"
#include "support/expect_throw.h"
#include "support/temp_dir.h"
#include "synthetic_checkpoint.h"

namespace deepspeed::checkpoint {
namespace {

using c10::IValue;
using testing::example_checkpoint;
using testing::known_tensor;
using testing::SyntheticZeroCheckpoint;
using testing::write_synthetic_zero_checkpoint;

std::vector<std::string> keys_of(const TensorDict& d) {
  std::vector<std::string> keys;
  for (const auto& item : d) keys.push_back(item.key());
  return keys;
}

void expect_reproduces(const SyntheticZeroCheckpoint& c, const TensorDict& out) {
  for (const auto& group : c.groups) {
    for (const auto& item : group) {
      ASSERT_TRUE(out.contains(item.key())) << item.key();
      EXPECT_EQ(out[item.key()].scalar_type(), at::kFloat);
      EXPECT_TRUE(at::equal(out[item.key()], item.value())) << item.key();
    }
  }
}

class Zero2Consolidation : public ::testing::TestWithParam<int> {};

TEST_P(Zero2Consolidation, ReproducesTheOriginalTensorsExactly) {
  testing::TempDir dir;
  const auto c = example_checkpoint(GetParam());
  write_synthetic_zero_checkpoint(c, dir.path(), "global_step7");
  TensorDict out = consolidate_zero_checkpoint(dir.path());  // tag from `latest`
  EXPECT_EQ(keys_of(out), (std::vector<std::string>{"norm.running_mean", "frozen.weight",
                                                    "embed.weight", "block.0.weight",
                                                    "block.0.bias", "norm.weight", "head.bias",
                                                    "head.weight"}));
  expect_reproduces(c, out);
  EXPECT_EQ(out["norm.running_mean"].scalar_type(), at::kFloat);  // buffers cast to fp32
  EXPECT_TRUE(at::equal(out["norm.running_mean"], c.buffers["norm.running_mean"].to(at::kFloat)));
  EXPECT_TRUE(at::equal(out["frozen.weight"], c.frozen["frozen.weight"]));
  EXPECT_TRUE(out["head.weight"].is_same(out["embed.weight"]));  // tied weight aliases

  ConsolidateOptions no_frozen;
  no_frozen.exclude_frozen_parameters = true;
  EXPECT_FALSE(consolidate_zero_checkpoint(dir.path(), "global_step7", no_frozen)
                   .contains("frozen.weight"));
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, Zero2Consolidation, ::testing::Values(1, 2, 3, 4));

// Note [Elastic ZeRO checkpoints]: the fp32 partitions are the same in both layouts, so
// zero_to_fp32 reads elastic files as it reads rigid ones; ds_to_universal refuses them by name
// (they hold no param_groups to carry over).
TEST(Consolidate, ElasticCheckpointConsolidatesAndHasNoUniversalForm) {
  testing::TempDir dir;
  const auto c = example_checkpoint(3);
  write_synthetic_zero_checkpoint(c, dir.path(), "t", /*elastic=*/true);
  expect_reproduces(c, consolidate_zero_checkpoint(dir.path(), "t"));
  EXPECT_THROW_WITH(ds_to_universal(dir.path() + "/t", dir.path() + "/u"), NotSupportedError,
                    "saved with zero_optimization.elastic_checkpoint");
}

TEST(Consolidate, Bf16CheckpointUsesThePrefixedFiles) {
  testing::TempDir dir;
  auto c = example_checkpoint(2);
  c.bf16 = true;
  write_synthetic_zero_checkpoint(c, dir.path(), "t");
  EXPECT_EQ(access((dir.path() + "/t/bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt").c_str(), F_OK), 0);
  expect_reproduces(c, consolidate_zero_checkpoint(dir.path(), "t"));
}

// The layout the engine writes: FlatGroup (round-robin order) partitions, padding stripped.
TEST(Consolidate, MatchesTheEnginesFlatGroupLayout) {
  const int world = 3;
  std::vector<at::Tensor> params = {known_tensor({4, 3}, 1), known_tensor({7}, 2),
                                    known_tensor({2, 2}, 3), known_tensor({5}, 4)};
  std::vector<std::string> names = {"a.weight", "a.bias", "b.weight", "b.bias"};
  std::vector<at::Tensor> originals;
  for (auto& p : params) originals.push_back(p.clone());
  runtime::FlatGroup group(params, names, world, 0, /*round_robin=*/true);

  testing::TempDir dir;
  const std::string tag_dir = tag_directory(dir.path(), "t");
  create_directories(tag_dir);
  ModelStates m;
  m.param_shapes.emplace(1);
  for (const auto& slot : group.slots()) {
    m.param_shapes->at(0).insert(slot.name, slot.param.sizes().vec());
    m.module.insert(slot.name, slot.param.detach());
  }
  save(m.to_ivalue(), tag_dir + "/" + model_states_file_name());
  for (int r = 0; r < world; ++r) {
    ZeroOptimizerFile f;
    const int64_t lo = r * group.partition_numel();
    const int64_t real = std::clamp<int64_t>(group.numel() - lo, 0, group.partition_numel());
    f.optimizer_state_dict.single_partition_of_fp32_groups = {group.partition(r).narrow(0, 0, real)};
    f.optimizer_state_dict.group_paddings = {group.partition_numel() - real};
    f.optimizer_state_dict.partition_count = {world};
    f.optimizer_state_dict.base_optimizer_state = new_dict();
    save(f.to_ivalue(), tag_dir + "/" + zero_optim_states_file_name(r));
  }
  TensorDict out = consolidate_zero_checkpoint(dir.path(), "t");
  for (size_t i = 0; i < names.size(); ++i) {
    EXPECT_TRUE(at::equal(out[names[i]], originals[i])) << names[i];
  }
  // Round-robin order: parameters 0 and 3 go to list 0, 1 to list 1, 2 to list 2.
  EXPECT_EQ(keys_of(out), (std::vector<std::string>{"a.weight", "b.bias", "a.bias", "b.weight"}));
}

// ZeRO-3 as Python DeepSpeed writes it: per rank a model-states file and fp32_flat_groups, each
// parameter ceil(numel/W) elements per rank, zero-padded.
TEST(Consolidate, Zero3FromPythonDeepSpeedsLayout) {
  const int world = 3;
  TensorDict params;
  params.insert("w", known_tensor({4, 2}, 1));  // 8 -> 3 per rank
  params.insert("b", known_tensor({2}, 2));     // 2 -> 1 per rank
  at::Tensor frozen = known_tensor({5}, 3);     // 5 -> 2 per rank
  testing::TempDir dir;
  const std::string tag_dir = tag_directory(dir.path(), "z3");
  create_directories(tag_dir);
  for (int r = 0; r < world; ++r) {
    ModelStates m;
    m.param_shapes.emplace(1);
    std::vector<at::Tensor> pieces;
    for (const auto& item : params) {
      m.param_shapes->at(0).insert(item.key(), item.value().sizes().vec());
      const int64_t part = (item.value().numel() + world - 1) / world;
      at::Tensor padded = at::zeros({part * world});
      padded.narrow(0, 0, item.value().numel()).copy_(item.value().reshape(-1));
      pieces.push_back(padded.narrow(0, r * part, part));
      m.module.insert(item.key(), at::zeros({0}));  // ZeRO-3 placeholders
    }
    m.frozen_param_shapes.emplace();
    m.frozen_param_shapes->insert("f", Shape{5});
    at::Tensor fpad = at::zeros({6});
    fpad.narrow(0, 0, 5).copy_(frozen);
    m.frozen_param_fragments.emplace();
    m.frozen_param_fragments->insert("f", fpad.narrow(0, 2 * r, 2));
    save(m.to_ivalue(), tag_dir + "/" + zero3_model_states_file_name(r));

    Dict osd = new_dict();
    osd.insert("zero_stage", python_object("deepspeed.runtime.zero.config.ZeroStageEnum", {IValue(3)}));
    osd.insert("partition_count", world);
    c10::impl::GenericList flat(c10::AnyType::get());
    flat.push_back(at::cat(pieces));
    osd.insert("fp32_flat_groups", flat);
    Dict file = new_dict();
    file.insert("optimizer_state_dict", osd);
    save(IValue(file), tag_dir + "/" + zero_optim_states_file_name(r));
  }
  TensorDict out = consolidate_zero_checkpoint(dir.path(), "z3");
  EXPECT_EQ(keys_of(out), (std::vector<std::string>{"f", "w", "b"}));
  EXPECT_TRUE(at::equal(out["w"], params["w"]));
  EXPECT_TRUE(at::equal(out["b"], params["b"]));
  EXPECT_TRUE(at::equal(out["f"], frozen));
}

class BrokenCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    write_synthetic_zero_checkpoint(example_checkpoint(3), dir.path(), "t");
  }
  std::string file(int rank) {
    return tag_directory(dir.path(), "t") + "/" + zero_optim_states_file_name(rank);
  }
  testing::TempDir dir;
};

TEST_F(BrokenCheckpoint, MissingRankFile) {
  ::unlink(file(1).c_str());
  EXPECT_THROW_WITH(consolidate_zero_checkpoint(dir.path()), CheckpointError,
                    "expected 3 '*_optim_states.pt' files (partition_count) but found 2; missing "
                    "data-parallel rank(s) 1");
}

TEST_F(BrokenCheckpoint, MismatchedPartitionCount) {
  save(testing::synthetic_optimizer_file(example_checkpoint(2), 1).to_ivalue(), file(1));
  EXPECT_THROW_WITH(consolidate_zero_checkpoint(dir.path()), CheckpointError,
                    "zero_pp_rank_1_mp_rank_00_optim_states.pt: partition_count 2 and zero_stage 2 "
                    "differ from");
}

TEST_F(BrokenCheckpoint, TruncatedRankFile) {
  std::ifstream in(file(2), std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::ofstream(file(2), std::ios::binary | std::ios::trunc) << bytes.substr(0, bytes.size() - 100);
  EXPECT_THROW_WITH(consolidate_zero_checkpoint(dir.path()), CheckpointError,
                    "zero_pp_rank_2_mp_rank_00_optim_states.pt: no zip end-of-central-directory "
                    "record (the file is truncated or corrupted");
}

TEST_F(BrokenCheckpoint, NoLatestAndNoTag) {
  ::unlink((dir.path() + "/latest").c_str());
  EXPECT_THROW_WITH(consolidate_zero_checkpoint(dir.path()), CheckpointError,
                    "unable to find 'latest' file");
  EXPECT_THROW_WITH(consolidate_zero_checkpoint(dir.path(), "nope"), CheckpointError,
                    "/nope does not exist");
}

TEST_F(BrokenCheckpoint, ParamShapesThatDoNotMatchThePartitions) {
  auto c = example_checkpoint(3);
  c.groups[1].insert("extra", at::zeros({9}));  // more than the padding can hide
  save(testing::synthetic_model_states(c).to_ivalue(),
       tag_directory(dir.path(), "t") + "/" + model_states_file_name());
  EXPECT_THROW_WITH(consolidate_zero_checkpoint(dir.path()), CheckpointError,
                    "parameter 'extra' (group 1) needs elements [8, 17) but the 3 rank partitions "
                    "hold only 8 elements");
  c = example_checkpoint(3);
  c.groups[0].erase("block.0.bias");  // 5 elements left over: more than padding
  save(testing::synthetic_model_states(c).to_ivalue(),
       tag_directory(dir.path(), "t") + "/" + model_states_file_name());
  EXPECT_THROW_WITH(consolidate_zero_checkpoint(dir.path()), CheckpointError,
                    "consumed 60 of the 65 elements of param group 0");
}

TEST_F(BrokenCheckpoint, ModelStatesWithoutZero) {
  ModelStates m;  // param_shapes None: a non-ZeRO checkpoint
  m.buffer_names = {};
  save(m.to_ivalue(), tag_directory(dir.path(), "t") + "/" + model_states_file_name());
  EXPECT_THROW_WITH(consolidate_zero_checkpoint(dir.path()), CheckpointError,
                    "'param_shapes' is None");
}

}  // namespace
}  // namespace deepspeed::checkpoint
