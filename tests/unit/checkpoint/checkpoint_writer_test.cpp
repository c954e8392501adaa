// checkpoint.writer's ways of writing a file (Note [O_DIRECT checkpoint writes], Note [Decoupled
// checkpoints]): each writes the bytes the standard writer writes, or (MOCK) none; a snapshot
// keeps the values of save time; a decoupled writer reports a failed write when waited for.
#include <fcntl.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "deepspeed/checkpoint.h"
#include "runtime/checkpoint/checkpoint_writer.h"
#include "runtime/checkpoint/value_snapshot.h"
#include "support/expect_throw.h"
#include "support/temp_dir.h"

namespace deepspeed::checkpoint {
namespace {

using c10::IValue;
using testing::TempDir;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Whether the file system of `dir` takes O_DIRECT (ext4 and xfs do; older tmpfs does not).
bool takes_direct_io(const std::string& dir) {
  const std::string probe = dir + "/direct_probe";
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_DIRECT, 0644);
  if (fd >= 0) ::close(fd);
  ::unlink(probe.c_str());
  return fd >= 0;
}

// What checkpoints hold: a flat buffer and views of it, a tensor met twice, two tensors covering
// one storage, a bf16 tensor, numbers, strings, nested containers, torch.Size, a Python object.
IValue sample_value() {
  at::manual_seed(5);
  at::Tensor flat = at::randn({10007});  // not a multiple of the O_DIRECT block
  at::Tensor first = flat.narrow(0, 0, 300).view({30, 10});
  at::Tensor moments = at::randn({4096});
  Dict state = new_dict();
  state.insert("cur_scale", 65536.0);
  state.insert("scale_history", at::arange(5, at::kFloat));
  Dict d = new_dict();
  d.insert("flat", flat);
  d.insert("first", first);
  d.insert("again", first);
  d.insert("moments", moments);
  d.insert("moments_as_int", moments.view(at::kInt));
  d.insert("half", at::randn({33}).to(at::kBFloat16));
  d.insert("strided", at::randn({8, 6}).t());
  d.insert("step", int64_t{7});
  d.insert("name", std::string("global_step7"));
  c10::impl::GenericList list(c10::AnyType::get());
  list.push_back(at::ones({3}));
  list.push_back(c10::ivalue::Tuple::create({IValue(int64_t{1}), IValue(at::zeros({2}))}));
  d.insert("groups", list);
  d.insert("shape", torch_size({30, 10}));
  d.insert("scaler", python_object("deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler", {},
                                   state));
  return d;
}

std::string saved_bytes(const IValue& value, const std::string& path, WriteOptions options) {
  save(value, path, options);
  return read_file(path);
}

TEST(CheckpointWriter, FastWritesTheStandardWritersBytesThroughStagingBuffers) {
  TempDir dir;
  const IValue value = sample_value();
  const std::string want = saved_bytes(value, dir.file("standard.pt"), {});
  ASSERT_GT(want.size(), 50000u);
  struct Case {
    int64_t buffer;
    bool twice;
  };
  for (const Case c : {Case{8192, true}, Case{4096, false}, Case{12288, false},
                       Case{64 << 20, true}}) {
    WriteStats stats;
    WriteOptions o;
    o.mode = WriteMode::kDirect;
    o.io_buffer_size = c.buffer;
    o.io_buffer_double = c.twice;
    o.stats = &stats;
    const std::string name = "fast_" + std::to_string(c.buffer) + (c.twice ? "x2" : "") + ".pt";
    EXPECT_EQ(saved_bytes(value, dir.file(name), o), want) << name;
    EXPECT_EQ(stats.bytes, static_cast<int64_t>(want.size())) << name;
    EXPECT_EQ(stats.direct_io, takes_direct_io(dir.path())) << name;
    // Full buffers, then the aligned part of the last one.
    const int64_t half = c.twice ? c.buffer / 2 : c.buffer;
    const int64_t full = static_cast<int64_t>(want.size()) / half;
    const bool aligned_rest = static_cast<int64_t>(want.size()) % half >= 4096;
    EXPECT_EQ(stats.buffers, full + (aligned_rest ? 1 : 0)) << name;
    EXPECT_TRUE(load(dir.file(name)).isGenericDict());
  }
}

TEST(CheckpointWriter, MockSerializesAndCountsButWritesAnEmptyFile) {
  TempDir dir;
  const IValue value = sample_value();
  const std::string want = saved_bytes(value, dir.file("standard.pt"), {});
  WriteStats stats;
  WriteOptions o;
  o.mode = WriteMode::kMock;
  o.stats = &stats;
  EXPECT_EQ(saved_bytes(value, dir.file("mock.pt"), o), "");
  EXPECT_EQ(stats.bytes, static_cast<int64_t>(want.size()));
  EXPECT_THROW_WITH(load(dir.file("mock.pt")), CheckpointError, "the file is empty");
}

TEST(CheckpointWriter, SnapshotWritesTheBytesOfSaveTimeWhateverHappensToTheOriginals) {
  TempDir dir;
  const IValue value = sample_value();
  const std::string want = saved_bytes(value, dir.file("before.pt"), {});
  const IValue frozen = snapshot_for_save(value, "sample");
  // Training changes everything in place.
  const Dict d = value.toGenericDict();
  for (const char* key : {"flat", "moments", "half", "strided"}) d.at(key).toTensor().fill_(3);
  d.at("groups").toList().get(0).toTensor().fill_(3);
  as_python_object(d.at("scaler"))->state.at("scale_history").toTensor().fill_(3);
  EXPECT_NE(saved_bytes(value, dir.file("after.pt"), {}), want);
  EXPECT_EQ(saved_bytes(frozen, dir.file("frozen.pt"), {}), want);
  // Shared storage and identity carry over: the tensor met twice is one object.
  const Dict f = frozen.toGenericDict();
  EXPECT_TRUE(f.at("first").toTensor().is_same(f.at("again").toTensor()));
  EXPECT_EQ(f.at("moments").toTensor().data_ptr(), f.at("moments_as_int").toTensor().data_ptr());
  EXPECT_THROW_WITH(snapshot_for_save(at::ones({2, 2}).to_sparse(), "model_states.pt"),
                    NotSupportedError, "checkpoint value model_states.pt: only dense tensors");
}

CheckpointWriterConfig decoupled_config() {
  CheckpointWriterConfig c;
  c.type = "PYTHON";
  c.decoupled = true;
  return c;
}

TEST(CheckpointWriter, DecoupledWritesFromItsSnapshotsInTheBackground) {
  TempDir dir;
  CheckpointWriter writer(decoupled_config());
  ASSERT_TRUE(writer.decoupled());
  // A large first file keeps the thread busy while the caller changes the second one's tensor.
  writer.save(ivalue_from_tensors({{"big", at::randn({16 << 20})}}), dir.file("big.pt"));
  at::Tensor t = at::arange(1000, at::kFloat);
  writer.save(ivalue_from_tensors({{"t", t}}), dir.file("small.pt"));
  t.fill_(-1);
  const CheckpointWriter::Summary done = writer.wait();
  EXPECT_EQ(done.files, 2);
  EXPECT_GT(done.bytes, 64 << 20);
  const TensorDict small = tensors_from_ivalue(load(dir.file("small.pt")), "small.pt");
  EXPECT_TRUE(small["t"].equal(at::arange(1000, at::kFloat)));
  EXPECT_EQ(writer.wait().files, 0);  // nothing since
}

TEST(CheckpointWriter, DecoupledReportsTheFirstFailedWriteWhenWaitedFor) {
  TempDir dir;
  CheckpointWriter writer(decoupled_config());
  const std::string missing = dir.file("no_such_dir/model_states.pt");
  writer.save(ivalue_from_tensors({{"a", at::ones({4})}}), missing);  // queued: no error yet
  writer.save(ivalue_from_tensors({{"b", at::ones({4})}}), dir.file("after.pt"));
  EXPECT_THROW_WITH(writer.wait(), CheckpointError, "no_such_dir");
  EXPECT_FALSE(std::ifstream(dir.file("after.pt")).good());  // a failed checkpoint stops
  writer.save(ivalue_from_tensors({{"c", at::ones({4})}}), dir.file("next.pt"));
  EXPECT_EQ(writer.wait().files, 1);  // the next checkpoint starts afresh
}

TEST(CheckpointWriter, ImmediateSaverWritesBeforeReturningEvenWhenDecoupled) {
  TempDir dir;
  CheckpointWriterConfig c = decoupled_config();
  c.type = "FAST";
  c.io_buffer_size = 8192;
  CheckpointWriter writer(c);
  writer.immediate_saver()(ivalue_from_tensors({{"w", at::ones({5000})}}), dir.file("16bit.pt"));
  EXPECT_TRUE(tensors_from_ivalue(load(dir.file("16bit.pt")), "16bit.pt")["w"].equal(
      at::ones({5000})));
}

}  // namespace
}  // namespace deepspeed::checkpoint
