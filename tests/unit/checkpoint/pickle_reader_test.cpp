// The unpickler on bytes CPython 3.11's pickler wrote (protocol 2 as torch.save uses, and 4),
// for the Python values DeepSpeed checkpoints hold besides tensors; and on malformed input.
// The byte strings were produced by:  pickle.dumps(value, protocol=2)  (see each test).
#include <gtest/gtest.h>

#include "deepspeed/checkpoint.h"
#include "runtime/checkpoint/pickle_reader.h"
#include "runtime/checkpoint/value_access.h"
#include "support/expect_throw.h"

namespace deepspeed::checkpoint {
namespace {

using c10::IValue;

IValue unpickle(const std::string& bytes) {
  return detail::unpickle_value(bytes.data(), bytes.size(), [](const std::string&, size_t) {
    ADD_FAILURE() << "no storage expected";
    return c10::Storage();
  }, "test.pkl");
}

TEST(PickleReader, OrderedDictWithMetadataBecomesADict) {
  // od = OrderedDict([('a', 1), ('b', [1.5, None])]); od._metadata = OrderedDict([('', {'version': 1})])
  const std::string bytes(
      "\x80\x02\x63\x63\x6f\x6c\x6c\x65\x63\x74\x69\x6f\x6e\x73\x0a\x4f\x72\x64\x65\x72\x65\x64"
      "\x44\x69\x63\x74\x0a\x71\x00\x29\x52\x71\x01\x28\x58\x01\x00\x00\x00\x61\x71\x02\x4b\x01"
      "\x58\x01\x00\x00\x00\x62\x71\x03\x5d\x71\x04\x28\x47\x3f\xf8\x00\x00\x00\x00\x00\x00\x4e"
      "\x65\x75\x7d\x71\x05\x58\x09\x00\x00\x00\x5f\x6d\x65\x74\x61\x64\x61\x74\x61\x71\x06\x68"
      "\x00\x29\x52\x71\x07\x58\x00\x00\x00\x00\x71\x08\x7d\x71\x09\x58\x07\x00\x00\x00\x76\x65"
      "\x72\x73\x69\x6f\x6e\x71\x0a\x4b\x01\x73\x73\x73\x62\x2e", 124);
  IValue v = unpickle(bytes);
  ASSERT_TRUE(v.isGenericDict());
  auto d = v.toGenericDict();
  EXPECT_EQ(d.size(), 2u);
  EXPECT_EQ(d.at("a").toInt(), 1);
  auto b = d.at("b").toListRef();
  EXPECT_EQ(b[0].toDouble(), 1.5);
  EXPECT_TRUE(b[1].isNone());
}

TEST(PickleReader, SetBecomesAList) {
  // {3}
  const std::string bytes(
      "\x80\x02\x63\x5f\x5f\x62\x75\x69\x6c\x74\x69\x6e\x5f\x5f\x0a\x73\x65\x74\x0a\x71\x00\x5d"
      "\x71\x01\x4b\x03\x61\x85\x71\x02\x52\x71\x03\x2e", 34);
  IValue v = unpickle(bytes);
  auto items = v.toListRef();
  ASSERT_EQ(items.size(), 1u);
  EXPECT_EQ(items[0].toInt(), 3);
}

TEST(PickleReader, EnumMemberByNameIsReadAsAZeroStage) {
  // Stage.gradients of `class Stage(enum.IntEnum): gradients = 2` in __main__: Python 3.11
  // pickles it as getattr(Stage, 'gradients').
  const std::string bytes(
      "\x80\x02\x63\x5f\x5f\x62\x75\x69\x6c\x74\x69\x6e\x5f\x5f\x0a\x67\x65\x74\x61\x74\x74\x72"
      "\x0a\x71\x00\x63\x5f\x5f\x6d\x61\x69\x6e\x5f\x5f\x0a\x53\x74\x61\x67\x65\x0a\x71\x01\x58"
      "\x09\x00\x00\x00\x67\x72\x61\x64\x69\x65\x6e\x74\x73\x71\x02\x86\x71\x03\x52\x71\x04\x2e",
      66);
  IValue v = unpickle(bytes);
  auto object = as_python_object(v);
  ASSERT_TRUE(object.has_value());
  EXPECT_EQ(object->class_path, "__builtin__.getattr");
  EXPECT_EQ(detail::as_zero_stage(v, "zero_stage"), 2);
  // Older Pythons pickle the value instead: ZeroStageEnum(1).
  EXPECT_EQ(detail::as_zero_stage(
                python_object("deepspeed.runtime.zero.config.ZeroStageEnum", {IValue(1)}), "z"),
            1);
  EXPECT_EQ(detail::as_zero_stage(IValue(2), "z"), 2);
}

TEST(PickleReader, DataclassInstanceKeepsItsFields) {
  // Frag(4, 8) of `@dataclass class Frag: numel: int; start: int` in __main__
  const std::string bytes(
      "\x80\x02\x63\x5f\x5f\x6d\x61\x69\x6e\x5f\x5f\x0a\x46\x72\x61\x67\x0a\x71\x00\x29\x81\x71"
      "\x01\x7d\x71\x02\x28\x58\x05\x00\x00\x00\x6e\x75\x6d\x65\x6c\x71\x03\x4b\x04\x58\x05\x00"
      "\x00\x00\x73\x74\x61\x72\x74\x71\x04\x4b\x08\x75\x62\x2e", 58);
  auto object = as_python_object(unpickle(bytes));
  ASSERT_TRUE(object.has_value());
  EXPECT_EQ(object->class_path, "__main__.Frag");
  EXPECT_EQ(object->state.at("numel").toInt(), 4);
  EXPECT_EQ(object->state.at("start").toInt(), 8);
}

TEST(PickleReader, BytesThroughCodecsEncode) {
  // b'\x00\xff'
  const std::string bytes(
      "\x80\x02\x63\x5f\x63\x6f\x64\x65\x63\x73\x0a\x65\x6e\x63\x6f\x64\x65\x0a\x71\x00\x58\x03"
      "\x00\x00\x00\x00\xc3\xbf\x71\x01\x58\x06\x00\x00\x00\x6c\x61\x74\x69\x6e\x31\x71\x02\x86"
      "\x71\x03\x52\x71\x04\x2e", 50);
  EXPECT_EQ(unpickle(bytes).toStringRef(), std::string("\x00\xff", 2));
}

TEST(PickleReader, Protocol4FramesAndSets) {
  // {'key': (1, 'v'), 'n': {1, 2}} with protocol=4
  const std::string bytes(
      "\x80\x04\x95\x1f\x00\x00\x00\x00\x00\x00\x00\x7d\x94\x28\x8c\x03\x6b\x65\x79\x94\x4b\x01"
      "\x8c\x01\x76\x94\x86\x94\x8c\x01\x6e\x94\x8f\x94\x28\x4b\x01\x4b\x02\x90\x75\x2e", 42);
  auto d = unpickle(bytes).toGenericDict();
  EXPECT_EQ(d.at("key").toTupleRef().elements()[1].toStringRef(), "v");
  EXPECT_EQ(d.at("n").toListRef().size(), 2u);
}

TEST(PickleReader, MemoizedListIsShared) {
  // l = [7]; [l, l]
  const std::string bytes("\x80\x02\x5d\x71\x00\x28\x5d\x71\x01\x4b\x07\x61\x68\x01\x65\x2e", 16);
  IValue v = unpickle(bytes);
  auto items = v.toListRef();
  ASSERT_EQ(items.size(), 2u);
  EXPECT_TRUE(items[0].is(items[1]));
}

TEST(PickleReader, MalformedInputNamesTheOffset) {
  // 2**70 does not fit in int64
  EXPECT_THROW_WITH(unpickle(std::string("\x80\x02\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00\x40\x2e", 14)),
                    CheckpointError, "does not fit in int64");
  EXPECT_THROW_WITH(unpickle(std::string("\x80\x02K", 3)), CheckpointError,
                    "test.pkl: pickle data at byte 3: truncated");
  EXPECT_THROW_WITH(unpickle(std::string("\x80\x02I1\n.", 6)), CheckpointError,
                    "unsupported pickle opcode 0x49");
  EXPECT_THROW_WITH(unpickle(std::string("\x80\x02h\x05.", 5)), CheckpointError,
                    "memo entry 5 read before it was written");
  EXPECT_THROW_WITH(unpickle(std::string("\x80\x02\x63numpy.core.multiarray\n_reconstruct\n)R.")),
                    CheckpointError, "numpy values");
}

// Note [Nesting depth of loaded values]: 10^6 nested containers (2 MB) end in a CheckpointError
// naming the limit, not in a stack overflow while building, destroying or using them.
TEST(PickleReader, DeepNestingIsRefusedWithoutOverflowingTheStack) {
  const int n = 1000000;
  const std::string proto("\x80\x02", 2);
  const std::vector<std::pair<const char*, std::string>> bombs = {
      {"lists by APPEND", proto + std::string(n, ']') + std::string(n - 1, 'a') + "."},
      {"lists by MARK/LIST", proto + std::string(n, '(') + std::string(n, 'l') + "."},
      {"tuples", proto + ")" + std::string(n, '\x85') + "."},
      {"dicts", [&] {
         std::string p = proto + "}";
         for (int i = 1; i < n; ++i) p += std::string("K\x00}", 3);
         return p + std::string(n - 1, 's') + ".";
       }()},
  };
  for (const auto& [what, bytes] : bombs) {
    SCOPED_TRACE(what);
    EXPECT_THROW_WITH(unpickle(bytes), CheckpointError, "test.pkl: pickle data at byte ");
    EXPECT_THROW_WITH(unpickle(bytes), CheckpointError, "values nested deeper than 1000 levels");
  }
}

TEST(PickleReader, NestingUpToTheLimitLoads) {
  auto nested_lists = [](int depth) {
    return std::string("\x80\x02", 2) + std::string(depth, ']') + std::string(depth - 1, 'a') + ".";
  };
  IValue v = unpickle(nested_lists(1000));
  int depth = 1;
  for (; !v.toListRef().empty(); ++depth) v = v.toListRef()[0];
  EXPECT_EQ(depth, 1000);
  EXPECT_THROW_WITH(unpickle(nested_lists(1001)), CheckpointError, "nested deeper than 1000");
}

// A container changed after it was placed inside another could grow any height unseen, so it is
// refused: that is how a pickle nests 10^6 lists top-down through the memo.
TEST(PickleReader, ContainersChangedAfterBeingPlacedAreRefused) {
  auto u32 = [](uint32_t i) { return std::string(reinterpret_cast<const char*>(&i), 4); };
  std::string top_down("\x80\x02", 2);
  const uint32_t n = 100000;
  for (uint32_t i = 0; i < n; ++i) top_down += "]r" + u32(i);  // EMPTY_LIST, LONG_BINPUT i
  for (uint32_t i = 0; i + 1 < n; ++i) top_down += "j" + u32(i) + "j" + u32(i + 1) + "a0";
  top_down += ".";
  EXPECT_THROW_WITH(unpickle(top_down), CheckpointError,
                    "a GenericList is changed after it was placed inside another value");
  // a = []; a.append(a): what CPython pickles for a recursive list.
  EXPECT_THROW_WITH(unpickle(std::string("\x80\x02]q\x00h\x00" "a.", 9)), CheckpointError,
                    "a GenericList placed inside itself: recursive structures are not supported");
}

}  // namespace
}  // namespace deepspeed::checkpoint
