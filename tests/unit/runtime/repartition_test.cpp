// repartition_zero_state (runtime/zero/repartition.h), the one routine that re-lays a ZeRO
// checkpoint written by W ranks for this engine's flats, in one process: the stage-1/2 layout
// (contiguous partitions of a flat group) and the stage-3 layout (every parameter cut into W
// shards), with the masters, per-element optimizer state, scalars and param groups.
#include "runtime/zero/repartition.h"

#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace deepspeed::runtime {
namespace {

namespace ckpt = checkpoint;
using List = c10::impl::GenericList;

at::Tensor range(int64_t from, int64_t n) {
  return torch::arange(from, from + n, torch::kFloat);
}

// An inner optimizer state dict: param group `groups[pg]` lists `ids`, and `state[id]` is
// {"step": step, "exp_avg": tensor}.
c10::IValue optimizer_state(const std::vector<std::vector<int64_t>>& groups,
                            const std::map<int64_t, at::Tensor>& exp_avg, int64_t step) {
  ckpt::Dict state = ckpt::new_dict();
  for (const auto& [id, t] : exp_avg) {
    ckpt::Dict entry = ckpt::new_dict();
    entry.insert("step", step);
    entry.insert("exp_avg", t);
    state.insert(id, entry);
  }
  List param_groups(c10::AnyType::get());
  for (size_t pg = 0; pg < groups.size(); ++pg) {
    ckpt::Dict g = ckpt::new_dict();
    g.insert("lr", 0.1 * static_cast<double>(pg + 1));
    List ids(c10::AnyType::get());
    for (int64_t id : groups[pg]) ids.push_back(id);
    g.insert("params", ids);
    param_groups.push_back(g);
  }
  ckpt::Dict top = ckpt::new_dict();
  top.insert("state", state);
  top.insert("param_groups", param_groups);
  return top;
}

ckpt::ShapeDict shapes_of(const std::vector<std::pair<std::string, ckpt::Shape>>& params) {
  ckpt::ShapeDict d;
  for (const auto& [name, shape] : params) d.insert(name, shape);
  return d;
}

// Stages 1/2: a (3 elements) and b (2x2) flattened into one group of 7, saved by 2 ranks
// (partitions of 4; rank 1's fp32 partition without its padding, its state with it), loaded on
// 1 rank (one partition of 8).
TEST(RepartitionZeroState, FlatGroupsFromTwoRanksToOne) {
  const ckpt::ShapeDict shapes = shapes_of({{"a", {3}}, {"b", {2, 2}}});
  SavedZeroRanks saved;
  saved.source = "ckpt";
  saved.masters = {{range(0, 4)}, {range(4, 3)}};
  at::Tensor avg1 = at::zeros({4});
  avg1.narrow(0, 0, 3).copy_(range(104, 3));
  saved.optimizer_states = {optimizer_state({{0}}, {{0, range(100, 4)}}, 5),
                            optimizer_state({{0}}, {{0, avg1}}, 5)};
  saved.state_numel = {4};

  FlatGroupLayout own;
  own.params = {{"a", {3}}, {"b", {2, 2}}};
  own.numel = 7;
  own.partition_numel = 8;
  RepartitionLayout layout;
  layout.split = [&](size_t k, const std::vector<at::Tensor>& per_rank, SavedParams* out) {
    EXPECT_EQ(k, 0u);
    split_saved_group(at::cat(per_rank), shapes, "ckpt", out);
  };
  layout.assemble = [&](size_t, const SavedParams& params, at::ScalarType dtype) {
    return assemble_partition(own, params, dtype, "ckpt");
  };
  layout.saved_flat_of = [](size_t pg, int64_t) { return pg; };
  layout.own_flats = 1;
  layout.own_param_group = {0};

  RepartitionedZeroState out = repartition_zero_state(saved, layout);
  ASSERT_EQ(out.masters.size(), 1u);
  at::Tensor want = at::zeros({8});
  want.narrow(0, 0, 7).copy_(range(0, 7));
  EXPECT_TRUE(out.masters[0].equal(want)) << out.masters[0];

  ckpt::Dict top = out.optimizer_state.toGenericDict();
  auto groups = top.at("param_groups").toListRef();
  ASSERT_EQ(groups.size(), 1u);
  EXPECT_EQ(groups[0].toGenericDict().at("lr").toDouble(), 0.1);
  auto ids = groups[0].toGenericDict().at("params").toListRef();
  ASSERT_EQ(ids.size(), 1u);
  EXPECT_EQ(ids[0].toInt(), 0);
  ckpt::Dict entry = top.at("state").toGenericDict().at(0).toGenericDict();
  EXPECT_EQ(entry.at("step").toInt(), 5);  // a scalar: rank 0's, as it is
  at::Tensor want_avg = at::zeros({8});
  want_avg.narrow(0, 0, 7).copy_(range(100, 7));
  EXPECT_TRUE(entry.at("exp_avg").toTensor().equal(want_avg)) << entry.at("exp_avg").toTensor();
  // The keys keep their saved order.
  std::vector<std::string> keys;
  for (const auto& item : entry) keys.push_back(item.key().toStringRef());
  EXPECT_EQ(keys, (std::vector<std::string>{"step", "exp_avg"}));
}

// Stage 3: a (3) and b (2x2) in two saved sub-groups of 2 ranks' shards (ceil(n/2) each), both
// in param group 0; param group 1 had no state yet. Loaded on 1 rank with one sub-group holding
// both: its state joins the two saved sub-groups' per-element state by name.
TEST(RepartitionZeroState, Stage3SubGroupsMergeAcrossASubGroupSizeAndWorldChange) {
  const std::vector<ckpt::ShapeDict> shapes = {shapes_of({{"a", {3}}}),
                                               shapes_of({{"b", {2, 2}}})};
  std::vector<std::vector<Stage3Slot>> saved_slots;
  for (const auto& s : shapes) saved_slots.push_back(stage3_slots(s, 2));
  // a = 0 1 2: rank 0 holds {0, 1}, rank 1 {2, pad}; b = 3 4 5 6: rank 0 {3, 4}, rank 1 {5, 6}.
  const auto shard = [](std::vector<float> v) { return torch::tensor(v); };
  SavedZeroRanks saved;
  saved.source = "ckpt";
  saved.masters = {{shard({0, 1}), shard({3, 4})}, {shard({2, 0}), shard({5, 6})}};
  saved.optimizer_states = {
      optimizer_state({{0, 1}, {}}, {{0, shard({10, 11})}, {1, shard({13, 14})}}, 7),
      optimizer_state({{0, 1}, {}}, {{0, shard({12, 0})}, {1, shard({15, 16})}}, 7)};
  saved.state_numel = {2, 2};

  const std::vector<Stage3Slot> own = stage3_slots(shapes_of({{"a", {3}}, {"b", {2, 2}}}), 1);
  RepartitionLayout layout;
  layout.split = [&](size_t k, const std::vector<at::Tensor>& per_rank, SavedParams* out) {
    split_stage3_flats(per_rank, saved_slots[k], "ckpt", out);
  };
  layout.assemble = [&](size_t, const SavedParams& params, at::ScalarType dtype) {
    return assemble_stage3_flat(own, 7, 0, params, dtype, "ckpt");
  };
  layout.saved_flat_of = [](size_t, int64_t id) { return static_cast<size_t>(id); };
  layout.own_flats = 1;
  layout.own_param_group = {0};

  RepartitionedZeroState out = repartition_zero_state(saved, layout);
  ASSERT_EQ(out.masters.size(), 1u);
  EXPECT_TRUE(out.masters[0].equal(range(0, 7))) << out.masters[0];
  ckpt::Dict top = out.optimizer_state.toGenericDict();
  auto groups = top.at("param_groups").toListRef();
  ASSERT_EQ(groups.size(), 2u);  // every saved group, with its options
  EXPECT_EQ(groups[0].toGenericDict().at("params").toListRef().size(), 1u);
  EXPECT_EQ(groups[1].toGenericDict().at("params").toListRef().size(), 0u);
  EXPECT_EQ(groups[1].toGenericDict().at("lr").toDouble(), 0.2);
  ckpt::Dict state = top.at("state").toGenericDict();
  ASSERT_EQ(state.size(), 1u);
  ckpt::Dict entry = state.at(0).toGenericDict();
  EXPECT_EQ(entry.at("step").toInt(), 7);
  EXPECT_TRUE(entry.at("exp_avg").toTensor().equal(range(10, 7))) << entry.at("exp_avg").toTensor();
}

TEST(RepartitionZeroState, WithoutOptimizerStatesOnlyTheMasters) {
  const ckpt::ShapeDict shapes = shapes_of({{"a", {2}}});
  SavedZeroRanks saved;
  saved.source = "ckpt";
  saved.masters = {{range(0, 1)}, {range(1, 1)}};
  FlatGroupLayout own;
  own.params = {{"a", {2}}};
  own.numel = 2;
  own.partition_numel = 2;
  RepartitionLayout layout;
  layout.split = [&](size_t, const std::vector<at::Tensor>& per_rank, SavedParams* out) {
    split_saved_group(at::cat(per_rank), shapes, "ckpt", out);
  };
  layout.assemble = [&](size_t, const SavedParams& params, at::ScalarType dtype) {
    return assemble_partition(own, params, dtype, "ckpt");
  };
  layout.saved_flat_of = [](size_t pg, int64_t) { return pg; };
  layout.own_flats = 1;
  layout.own_param_group = {0};
  RepartitionedZeroState out = repartition_zero_state(saved, layout);
  EXPECT_TRUE(out.masters.at(0).equal(range(0, 2)));
  EXPECT_TRUE(out.optimizer_state.isNone());
}

}  // namespace
}  // namespace deepspeed::runtime
