// ModelStates: DeepSpeed's keys and value types, the round trip through a file, client state
// merging and DeepSpeed's client_state rule on load.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "deepspeed/checkpoint.h"
#include "support/expect_throw.h"
#include "support/temp_dir.h"
#include "synthetic_checkpoint.h"

namespace deepspeed::checkpoint {
namespace {

using c10::IValue;

std::vector<std::string> keys_of(const IValue& v) {
  std::vector<std::string> keys;
  for (const auto& e : v.toGenericDict()) keys.push_back(e.key().toStringRef());
  return keys;
}

ModelStates example() {
  auto m = testing::synthetic_model_states(testing::example_checkpoint(2));
  m.lr_scheduler = ivalue_from_json({{"last_batch_iteration", 6}});
  m.sparse_tensor_module_names = {"embed"};
  m.skipped_steps = 1;
  m.client_state = {{"epoch", IValue(3)}, {"global_steps", IValue(99)}};
  return m;
}

TEST(ModelStates, HasDeepSpeedsKeysInOrderWithTheirTypes) {
  IValue v = example().to_ivalue();
  EXPECT_EQ(keys_of(v), (std::vector<std::string>{
                            "module", "buffer_names", "optimizer", "param_shapes",
                            "frozen_param_shapes", "shared_params", "frozen_param_fragments",
                            "lr_scheduler", "data_sampler", "random_ltd",
                            "sparse_tensor_module_names", "skipped_steps", "global_steps",
                            "global_samples", "dp_world_size", "mp_world_size",
                            "checkpoint_parallel_dimensions", "ds_config", "ds_version", "epoch"}));
  auto d = v.toGenericDict();
  EXPECT_TRUE(d.at("optimizer").isNone());
  auto groups = d.at("param_shapes").toListRef();
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_TRUE(is_torch_size(groups[0].toGenericDict().at("embed.weight")));
  EXPECT_EQ(d.at("shared_params").toGenericDict().at("head.weight").toStringRef(), "embed.weight");
  EXPECT_EQ(d.at("global_steps").toInt(), 99);  // client state overrides, as state.update() does
  EXPECT_EQ(d.at("ds_config").toGenericDict().at("train_batch_size").toInt(), 8);
}

TEST(ModelStates, RoundTripsThroughAFile) {
  testing::TempDir dir;
  const ModelStates m = example();
  save(m.to_ivalue(), dir.file("m.pt"));
  ModelStates back = ModelStates::from_ivalue(load(dir.file("m.pt")), "m.pt");
  ASSERT_EQ(back.module.size(), m.module.size());
  for (const auto& item : m.module) {
    EXPECT_TRUE(at::equal(back.module[item.key()], item.value())) << item.key();
  }
  EXPECT_EQ(back.buffer_names, m.buffer_names);
  ASSERT_TRUE(back.param_shapes.has_value());
  EXPECT_EQ((*back.param_shapes)[0]["block.0.weight"], (Shape{5, 5}));
  EXPECT_EQ((*back.frozen_param_shapes)["frozen.weight"], (Shape{2, 3}));
  EXPECT_TRUE(at::equal((*back.frozen_param_fragments)["frozen.weight"],
                        (*m.frozen_param_fragments)["frozen.weight"]));
  EXPECT_EQ(*back.shared_params, *m.shared_params);
  EXPECT_EQ(json_from_ivalue(back.lr_scheduler, "lr"), json({{"last_batch_iteration", 6}}));
  EXPECT_EQ(back.sparse_tensor_module_names, std::vector<std::string>{"embed"});
  EXPECT_EQ(back.skipped_steps, 1);
  EXPECT_EQ(back.global_steps, 99);
  EXPECT_EQ(back.global_samples, 56);
  EXPECT_EQ(back.dp_world_size, 2);
  EXPECT_EQ(back.ds_config, m.ds_config);
  EXPECT_EQ(back.ds_version, "0.19.6");
  ASSERT_EQ(back.client_state.size(), 1u);  // global_steps became the own key again
  EXPECT_EQ(back.client_state[0].first, "epoch");
}

TEST(ModelStates, ReservedClientKeyIsRefused) {
  ModelStates m;
  m.client_state = {{"checkpoint_parallel_dimensions", IValue(1)}};
  EXPECT_THROW_WITH(m.to_ivalue(), UsageError, "reserved checkpoint key");
}

TEST(ModelStates, ParseErrorsNameFileAndKey) {
  Dict d = new_dict();
  d.insert("buffer_names", c10::impl::GenericList(c10::AnyType::get()));
  EXPECT_THROW_WITH(ModelStates::from_ivalue(d, "ck/mp_rank_00_model_states.pt"), CheckpointError,
                    "ck/mp_rank_00_model_states.pt: no 'module' key");
  d.insert("module", new_dict());
  d.insert("global_steps", "ten");
  EXPECT_THROW_WITH(ModelStates::from_ivalue(d, "f.pt"), CheckpointError,
                    "f.pt: 'global_steps' is a String, expected an int");
}

TEST(ModelStates, ClientStateFollowsDeepSpeedsRule) {
  IValue v = example().to_ivalue();
  auto keys = keys_of(IValue(client_state_of(v, false, true, true)));
  EXPECT_EQ(keys, (std::vector<std::string>{"buffer_names", "param_shapes", "frozen_param_shapes",
                                            "shared_params", "frozen_param_fragments",
                                            "global_samples", "checkpoint_parallel_dimensions",
                                            "ds_config", "ds_version", "epoch"}));
  auto module_only = client_state_of(v, true, false, false);
  EXPECT_FALSE(module_only.contains("module"));
  EXPECT_TRUE(module_only.contains("global_steps"));
  EXPECT_TRUE(module_only.contains("optimizer"));
  EXPECT_TRUE(module_only.contains("lr_scheduler"));
}

}  // namespace
}  // namespace deepspeed::checkpoint
