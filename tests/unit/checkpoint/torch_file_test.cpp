// save()/load(): every value kind round-trips, tensors of every dtype bit for bit, views are
// stored compactly, shared tensors stay shared, and broken files fail with the file named.
#include <fstream>
#include <limits>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "deepspeed/checkpoint.h"
#include "support/expect_throw.h"
#include "support/temp_dir.h"

namespace deepspeed::checkpoint {
namespace {

using c10::IValue;
using List = c10::impl::GenericList;

IValue round_trip(const IValue& v) { return load_from_string(save_to_string(v)); }

IValue get(const IValue& dict, const std::string& key) { return dict.toGenericDict().at(key); }

TEST(TorchFile, RoundTripsPlainValues) {
  const std::vector<int64_t> ints = {0,          1,         255,       256,
                                     65535,      65536,     -1,        -256,
                                     INT32_MAX,  INT32_MIN, int64_t{INT32_MAX} + 1,
                                     int64_t{INT32_MIN} - 1, int64_t{1} << 40,
                                     std::numeric_limits<int64_t>::max(),
                                     std::numeric_limits<int64_t>::min()};
  Dict d = new_dict();
  List int_list(c10::AnyType::get());
  for (auto i : ints) int_list.push_back(i);
  d.insert("ints", int_list);
  d.insert("none", IValue());
  d.insert("yes", true);
  d.insert("no", false);
  d.insert("pi", 3.141592653589793);
  d.insert("neg_zero", -0.0);
  d.insert("inf", std::numeric_limits<double>::infinity());
  d.insert("empty", std::string());
  d.insert("unicode", std::string("h\xc3\xa9llo \xe2\x82\xac"));
  d.insert("tuple", c10::ivalue::Tuple::create({IValue(1), IValue("a"), IValue(2.5), IValue(true)}));
  Dict int_keys = new_dict();
  int_keys.insert(int64_t{0}, "zero");
  int_keys.insert(int64_t{-7}, "minus seven");
  d.insert("int_keys", int_keys);
  Dict nested = new_dict();
  nested.insert("inner", List(c10::AnyType::get()));
  d.insert("nested", nested);

  IValue back = round_trip(d);
  auto back_ints = get(back, "ints").toListRef();
  ASSERT_EQ(back_ints.size(), ints.size());
  for (size_t i = 0; i < ints.size(); ++i) EXPECT_EQ(back_ints[i].toInt(), ints[i]) << i;
  EXPECT_TRUE(get(back, "none").isNone());
  EXPECT_TRUE(get(back, "yes").toBool());
  EXPECT_FALSE(get(back, "no").toBool());
  EXPECT_EQ(get(back, "pi").toDouble(), 3.141592653589793);
  EXPECT_TRUE(std::signbit(get(back, "neg_zero").toDouble()));
  EXPECT_TRUE(std::isinf(get(back, "inf").toDouble()));
  EXPECT_EQ(get(back, "empty").toStringRef(), "");
  EXPECT_EQ(get(back, "unicode").toStringRef(), "h\xc3\xa9llo \xe2\x82\xac");
  auto tuple = get(back, "tuple").toTupleRef().elements();
  ASSERT_EQ(tuple.size(), 4u);
  EXPECT_EQ(tuple[1].toStringRef(), "a");
  auto back_keys = get(back, "int_keys").toGenericDict();
  EXPECT_EQ(back_keys.at(int64_t{-7}).toStringRef(), "minus seven");
  EXPECT_EQ(get(get(back, "nested"), "inner").toListRef().size(), 0u);
  // Insertion order is kept.
  std::vector<std::string> keys;
  for (const auto& e : back.toGenericDict()) keys.push_back(e.key().toStringRef());
  EXPECT_EQ(keys.front(), "ints");
  EXPECT_EQ(keys.back(), "nested");
}

TEST(TorchFile, RoundTripsTensorsOfEveryDtypeBitForBit) {
  const std::vector<at::ScalarType> dtypes = {at::kFloat, at::kDouble, at::kHalf,  at::kBFloat16,
                                              at::kLong,  at::kInt,    at::kShort, at::kChar,
                                              at::kByte,  at::kBool,   at::kComplexFloat};
  List list(c10::AnyType::get());
  std::vector<at::Tensor> originals;
  for (auto dtype : dtypes) {
    at::Tensor t = (at::randn({3, 4}, at::kDouble) * 50).to(dtype);
    originals.push_back(t);
    list.push_back(t);
  }
  IValue loaded = round_trip(list);
  auto back = loaded.toListRef();
  ASSERT_EQ(back.size(), dtypes.size());
  for (size_t i = 0; i < dtypes.size(); ++i) {
    const at::Tensor& t = back[i].toTensor();
    EXPECT_EQ(t.scalar_type(), dtypes[i]);
    EXPECT_EQ(t.sizes(), originals[i].sizes());
    EXPECT_TRUE(at::equal(t, originals[i])) << dtypes[i];
  }
}

TEST(TorchFile, ScalarEmptyNonContiguousAndUndefinedTensors) {
  Dict d = new_dict();
  d.insert("scalar", at::scalar_tensor(2.5));
  d.insert("empty", at::zeros({0, 3}));
  at::Tensor base = at::arange(12, at::kFloat).reshape({3, 4});
  d.insert("transposed", base.t());
  d.insert("undefined", at::Tensor());
  IValue back = round_trip(d);
  EXPECT_EQ(get(back, "scalar").toTensor().dim(), 0);
  EXPECT_EQ(get(back, "scalar").toTensor().item<double>(), 2.5);
  EXPECT_EQ(get(back, "empty").toTensor().sizes(), at::IntArrayRef({0, 3}));
  EXPECT_TRUE(at::equal(get(back, "transposed").toTensor(), base.t()));
  EXPECT_TRUE(get(back, "undefined").isNone());
}

TEST(TorchFile, ViewsOfALargeBufferAreStoredCompactly) {
  at::Tensor flat = at::arange(1 << 20, at::kFloat);  // 4 MiB
  at::Tensor piece = flat.narrow(0, 1000, 10);
  const std::string bytes = save_to_string(IValue(piece));
  EXPECT_LT(bytes.size(), 4096u);
  at::Tensor back = load_from_string(bytes).toTensor();
  EXPECT_TRUE(at::equal(back, piece));
  EXPECT_EQ(back.storage().nbytes(), 40u);
}

TEST(TorchFile, TheSameTensorTwiceLoadsAsOneTensor) {
  at::Tensor w = at::randn({4, 4});
  Dict d = new_dict();
  d.insert("embed.weight", w);
  d.insert("head.weight", w);        // tied
  d.insert("reshaped", w.view({16})); // another tensor over the same storage
  IValue back = round_trip(d);
  at::Tensor a = get(back, "embed.weight").toTensor(), b = get(back, "head.weight").toTensor();
  at::Tensor c = get(back, "reshaped").toTensor();
  EXPECT_TRUE(a.is_same(b));
  EXPECT_EQ(a.data_ptr(), c.data_ptr());
  EXPECT_TRUE(at::equal(c, w.view({16})));
}

TEST(TorchFile, PythonObjectsRoundTrip) {
  Dict state = new_dict();
  state.insert("cur_scale", 1024.0);
  state.insert("dtype", python_global("torch.float16"));
  Dict d = new_dict();
  d.insert("shape", torch_size({3, 4}));
  d.insert("scalar_shape", torch_size({}));
  d.insert("names", python_set({IValue("a"), IValue("b")}));
  d.insert("empty_set", python_set({}));
  d.insert("scaler", python_object("deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler", {}, state));
  d.insert("stage", python_object("deepspeed.runtime.zero.config.ZeroStageEnum", {IValue(2)}));

  IValue back = round_trip(d);
  EXPECT_TRUE(is_torch_size(get(back, "shape")));
  EXPECT_EQ(shape_from_ivalue(get(back, "shape"), "shape"), (Shape{3, 4}));
  EXPECT_TRUE(shape_from_ivalue(get(back, "scalar_shape"), "s").empty());
  auto names = get(back, "names").toListRef();  // sets load as lists
  ASSERT_EQ(names.size(), 2u);
  EXPECT_EQ(names[1].toStringRef(), "b");
  EXPECT_EQ(get(back, "empty_set").toListRef().size(), 0u);
  auto scaler = as_python_object(get(back, "scaler"));
  ASSERT_TRUE(scaler.has_value());
  EXPECT_EQ(scaler->class_path, "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler");
  EXPECT_EQ(scaler->state.at("cur_scale").toDouble(), 1024.0);
  auto dtype = as_python_object(scaler->state.at("dtype"));
  ASSERT_TRUE(dtype && dtype->is_global);
  EXPECT_EQ(dtype->class_path, "torch.float16");
  auto stage = as_python_object(get(back, "stage"));
  ASSERT_TRUE(stage.has_value());
  ASSERT_EQ(stage->args.size(), 1u);
  EXPECT_EQ(stage->args[0].toInt(), 2);
  EXPECT_FALSE(as_python_object(IValue(3)).has_value());
}

TEST(TorchFile, JsonRoundTripKeepsIntsAndFloatsApart) {
  json config = {{"train_batch_size", 8}, {"lr", 1e-3}, {"flags", {true, nullptr, "x"}},
                 {"nested", {{"stage", 2}}}};
  IValue v = ivalue_from_json(config);
  EXPECT_TRUE(get(v, "train_batch_size").isInt());
  EXPECT_TRUE(get(v, "lr").isDouble());
  EXPECT_EQ(json_from_ivalue(round_trip(v), "ds_config"), config);
  EXPECT_THROW_WITH(json_from_ivalue(IValue(at::zeros({1})), "ds_config.x"), CheckpointError,
                    "ds_config.x");
}

TEST(TorchFile, SaveRefusesValuesPythonCannotHold) {
  Dict d = new_dict();
  d.insert("device", IValue(c10::Device(c10::kCPU)));
  EXPECT_THROW_WITH(save_to_string(d), NotSupportedError, "<root>.device");
  Dict float_keys = new_dict();
  float_keys.insert(1.5, 1);
  EXPECT_THROW_WITH(save_to_string(float_keys), NotSupportedError, "dict keys must be str or int");
}

// Note [Nesting depth of loaded values]: what saves, loads; deeper is refused on save.
TEST(TorchFile, NestingUpToTheLoadersLimitRoundTripsDeeperIsRefused) {
  auto nested = [](int depth) {
    List inner(c10::AnyType::get());
    for (int i = 1; i < depth; ++i) {
      List outer(c10::AnyType::get());
      outer.push_back(inner);
      inner = outer;
    }
    return IValue(inner);
  };
  IValue back = round_trip(nested(1000));
  int depth = 1;
  for (; !back.toListRef().empty(); ++depth) back = back.toListRef()[0];
  EXPECT_EQ(depth, 1000);
  EXPECT_THROW_WITH(save_to_string(nested(1001)), NotSupportedError,
                    "nested deeper than 1000 levels");
}

TEST(TorchFile, SaveAndLoadAFile) {
  testing::TempDir dir;
  const std::string path = dir.file("x.pt");
  Dict d = new_dict();
  d.insert("w", at::arange(5, at::kFloat));
  save(d, path);
  EXPECT_TRUE(at::equal(get(load(path), "w").toTensor(), at::arange(5, at::kFloat)));
}

TEST(TorchFile, BrokenFilesFailWithTheFileNamed) {
  testing::TempDir dir;
  Dict d = new_dict();
  d.insert("w", at::arange(1000, at::kFloat));
  const std::string good = save_to_string(d);
  auto write = [&](const std::string& name, const std::string& bytes) {
    std::ofstream(dir.file(name), std::ios::binary) << bytes;
    return dir.file(name);
  };
  EXPECT_THROW_WITH(load(dir.file("missing.pt")), CheckpointError, "missing.pt: cannot open");
  EXPECT_THROW_WITH(load(write("empty.pt", "")), CheckpointError, "empty.pt: the file is empty");
  EXPECT_THROW_WITH(load(write("text.pt", "hello world")), CheckpointError,
                    "text.pt: not a PyTorch checkpoint");
  EXPECT_THROW_WITH(load(write("legacy.pt", std::string("\x80\x02\x8a\x0a", 4))), CheckpointError,
                    "legacy (non-zip) format");
  const std::string truncated = write("truncated.pt", good.substr(0, good.size() / 2));
  EXPECT_THROW_WITH(load(truncated), CheckpointError, "truncated.pt");
  EXPECT_THROW_WITH(load(truncated), CheckpointError, "interrupted");
}

}  // namespace
}  // namespace deepspeed::checkpoint
