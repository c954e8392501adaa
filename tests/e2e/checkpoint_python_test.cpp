// Checkpoint files across the language boundary, with Debian's python3-torch: Python reads what
// deepspeed-cpp writes (torch.load, weights_only where possible, DeepSpeed's reconstruction
// rule), deepspeed-cpp reads what Python's torch.save and a DeepSpeed-style ZeRO-2 save wrote,
// and the zero_to_fp32 tool end to end (outputs, errors, a crash in the middle of writing).
// The Python half is checkpoint_python_test.py beside this file.
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include <ATen/ATen.h>
#include <caffe2/serialize/inline_container.h>
#include <gtest/gtest.h>

#include "deepspeed/checkpoint.h"
#include "runtime/checkpoint/value_access.h"
#include "support/run_command.h"
#include "support/temp_dir.h"
#include "synthetic_checkpoint.h"

namespace deepspeed::checkpoint {
namespace {

using c10::IValue;
using testing::run_command;
using List = c10::impl::GenericList;

const std::string kPython = DS_PYTHON;
const std::string kScript = DS_CHECKPOINT_PY;
const std::string kZeroToFp32 = DS_ZERO_TO_FP32_BIN;

// Skips (loudly: the reason is printed in the test output) without python3-torch.
#define REQUIRE_PYTHON_TORCH()                                                              \
  do {                                                                                      \
    static const auto probe = run_command(kPython + " -c 'import torch'");                  \
    if (probe.exit_code != 0) {                                                             \
      GTEST_SKIP() << "SKIPPED: " << kPython << " cannot import torch (install python3-torch," \
                   << " as scripts/install_deps.sh does): " << probe.err;                   \
    }                                                                                       \
  } while (0)

std::string python(const std::string& args) {
  auto r = run_command(kPython + " " + kScript + " " + args);
  return r.exit_code == 0 ? "" : "python " + args + " failed (" + std::to_string(r.exit_code) +
                                     "):\n" + r.out + r.err;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

at::Tensor ref_values() { return at::arange(12, at::kDouble).reshape({3, 4}) / 8 - 0.5; }

TEST(CheckpointPython, PythonReadsOurValues) {
  REQUIRE_PYTHON_TORCH();
  testing::TempDir dir;
  Dict d = new_dict();
  List ints(c10::AnyType::get());
  for (int64_t v : {int64_t{0}, int64_t{255}, int64_t{256}, int64_t{65536}, int64_t{-1},
                    int64_t{1} << 31, -(int64_t{1} << 31) - 1, int64_t{1} << 62}) {
    ints.push_back(v);
  }
  d.insert("ints", ints);
  d.insert("float", 0.1);
  d.insert("flags", ivalue_from_json({true, false, nullptr}));
  d.insert("text", std::string("h\xc3\xa9llo"));
  d.insert("nested", ivalue_from_json({{"a", {{"b", {1, "two", 3.5}}}}}));
  Dict int_keys = new_dict();
  int_keys.insert(int64_t{0}, "zero");
  int_keys.insert(int64_t{7}, "seven");
  d.insert("int_keys", int_keys);
  d.insert("tuple", c10::ivalue::Tuple::create({IValue(1), IValue("x")}));
  d.insert("shape", torch_size({3, 4}));
  d.insert("f32", ref_values().to(at::kFloat));
  d.insert("f16", ref_values().to(at::kHalf));
  d.insert("bf16", ref_values().to(at::kBFloat16));
  d.insert("i64", (ref_values() * 100).to(at::kLong));
  d.insert("b", at::tensor({1, 0, 1}).to(at::kBool));
  d.insert("view", at::arange(100, at::kFloat).narrow(0, 10, 5));
  at::Tensor tied = at::randn({2});
  d.insert("tied_a", tied);
  d.insert("tied_b", tied);
  save(d, dir.file("values.pt"));
  EXPECT_EQ(python("check_values " + dir.file("values.pt")), "");
}

TEST(CheckpointPython, PythonReadsOurModelAndOptimizerStates) {
  REQUIRE_PYTHON_TORCH();
  for (int world : {2, 3}) {
    testing::TempDir dir;
    testing::write_synthetic_zero_checkpoint(testing::example_checkpoint(world), dir.path(),
                                             "global_step7");
    EXPECT_EQ(python("check_checkpoint " + dir.path() + " global_step7 " + std::to_string(world)),
              "") << "world size " << world;
  }
}

TEST(CheckpointPython, WeReadWhatPythonsTorchSaveWrote) {
  REQUIRE_PYTHON_TORCH();
  testing::TempDir dir;
  ASSERT_EQ(python("write_values " + dir.file("py.pt")), "");
  detail::DictReader d(load(dir.file("py.pt")), "py.pt");

  TensorDict module = tensors_from_ivalue(d.at("module"), "module");
  std::vector<std::string> keys;
  for (const auto& item : module) keys.push_back(item.key());
  EXPECT_EQ(keys, (std::vector<std::string>{"0.weight", "0.bias", "1.weight", "1.bias",
                                            "1.running_mean", "1.running_var",
                                            "1.num_batches_tracked"}));
  EXPECT_TRUE(at::equal(module["0.weight"], at::arange(6, at::kFloat).reshape({2, 3})));
  EXPECT_TRUE(at::equal(module["1.bias"], at::arange(2, at::kFloat) + 3));
  EXPECT_EQ(module["1.num_batches_tracked"].scalar_type(), at::kLong);

  EXPECT_TRUE(is_torch_size(d.at("shape")));
  EXPECT_EQ(shape_from_ivalue(d.at("shape"), "shape"), (Shape{2, 3}));
  EXPECT_EQ(d.at("names").toListRef()[0].toStringRef(), "embed");
  auto numbers = d.at("numbers").toListRef();
  EXPECT_EQ(numbers[0].toDouble(), 1.5);
  EXPECT_EQ(numbers[1].toInt(), -2);
  EXPECT_EQ(numbers[2].toInt(), int64_t{1} << 40);
  EXPECT_TRUE(numbers[3].isNone());
  EXPECT_TRUE(numbers[4].toBool());
  EXPECT_EQ(d.at("int_keys").toGenericDict().at(int64_t{3}).toStringRef(), "three");

  at::Tensor bf16 = d.at("bf16").toTensor();
  EXPECT_EQ(bf16.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(at::equal(bf16, at::tensor({1.5, -2.0}).to(at::kBFloat16)));
  EXPECT_TRUE(at::equal(d.at("f16").toTensor(), at::tensor({0.25}).to(at::kHalf)));
  EXPECT_TRUE(at::equal(d.at("i64").toTensor(), at::tensor({int64_t{1} << 40, int64_t{-1}})));
  EXPECT_TRUE(at::equal(d.at("bool").toTensor(), at::tensor({1, 0}).to(at::kBool)));
  EXPECT_TRUE(at::equal(d.at("transposed").toTensor(),
                        at::arange(6, at::kFloat).reshape({2, 3}).t()));
  at::Tensor a = d.at("slice_a").toTensor(), b = d.at("slice_b").toTensor();
  EXPECT_TRUE(at::equal(a, at::arange(5, 10, at::kFloat)));
  EXPECT_TRUE(at::equal(b, at::arange(20, 22, at::kFloat)));
  EXPECT_EQ(a.storage().unsafeGetStorageImpl(), b.storage().unsafeGetStorageImpl());
  EXPECT_TRUE(d.at("tied_1").toTensor().is_same(d.at("tied_2").toTensor()));

  auto scaler = LossScalerState::from_ivalue(d.at("scaler"), "scaler");
  EXPECT_TRUE(scaler.dynamic);
  EXPECT_EQ(scaler.cur_scale, 1024.0);
  EXPECT_EQ(scaler.cur_iter, 10);
  EXPECT_EQ(scaler.cur_hysteresis, 1);
  EXPECT_EQ(scaler.dtype, at::kHalf);
  EXPECT_EQ(detail::as_zero_stage(d.at("stage"), "stage"), 2);
  auto fragment = as_python_object(d.at("fragment"));
  ASSERT_TRUE(fragment.has_value());
  EXPECT_EQ(fragment->class_path, "deepspeed.utils.tensor_fragment.fragment_address");
  EXPECT_EQ(fragment->state.at("start").toInt(), 8);
}

TEST(CheckpointPython, ReadsAPythonDeepSpeedZero2Checkpoint) {
  REQUIRE_PYTHON_TORCH();
  testing::TempDir dir;
  ASSERT_EQ(python("write_zero2 " + dir.path() + " global_step5 3"), "");
  const std::string tag_dir = dir.path() + "/global_step5";
  auto m = ModelStates::from_ivalue(load(tag_dir + "/mp_rank_00_model_states.pt"), "model");
  EXPECT_EQ(m.global_steps, 5);
  EXPECT_EQ(m.dp_world_size, 3);
  EXPECT_EQ(m.ds_config["optimizer"]["params"]["lr"], 1e-3);
  ASSERT_EQ(m.client_state.size(), 1u);
  EXPECT_EQ(m.client_state[0].first, "my_client_key");
  for (int r = 0; r < 3; ++r) {
    const std::string path = find_zero_optim_states_file(tag_dir, r, 0, /*bf16=*/false);
    auto f = ZeroOptimizerFile::from_ivalue(load(path), path);
    EXPECT_EQ(f.optimizer_state_dict.zero_stage, 2);
    EXPECT_EQ(f.optimizer_state_dict.loss_scaler.cur_scale, 16384.0);
    f.optimizer_state_dict.check_partition_count(3, path);
  }
  TensorDict expected = tensors_from_ivalue(load(dir.path() + "/expected.pt"), "expected");
  TensorDict got = consolidate_zero_checkpoint(dir.path());
  ASSERT_EQ(got.size(), expected.size());
  for (const auto& item : expected) {
    EXPECT_EQ(got[item.key()].scalar_type(), item.value().scalar_type()) << item.key();
    EXPECT_TRUE(at::equal(got[item.key()], item.value())) << item.key();
  }
}

// zero_to_fp32 on our checkpoints (2 and 3 ranks) and on a Python DeepSpeed-style one: .pt and
// .safetensors outputs read back by Python.
TEST(ZeroToFp32Tool, OutputsMatchTheOriginalTensorsInPython) {
  REQUIRE_PYTHON_TORCH();
  for (int world : {2, 3}) {
    testing::TempDir dir;
    const auto c = testing::example_checkpoint(world);
    testing::write_synthetic_zero_checkpoint(c, dir.path(), "global_step7");
    TensorDict expected;
    expected.insert("norm.running_mean", c.buffers["norm.running_mean"].to(at::kFloat));
    expected.insert("frozen.weight", c.frozen["frozen.weight"]);
    for (const auto& g : c.groups) {
      for (const auto& item : g) expected.insert(item.key(), item.value());
    }
    expected.insert("head.weight", expected["embed.weight"]);
    save(ivalue_from_tensors(expected), dir.file("expected.pt"));

    auto pt = run_command(kZeroToFp32 + " " + dir.path() + " " + dir.file("out.pt"));
    ASSERT_EQ(pt.exit_code, 0) << pt.err;
    EXPECT_NE(pt.out.find("Saved 8 tensors"), std::string::npos) << pt.out;
    auto st = run_command(kZeroToFp32 + " " + dir.path() + " " + dir.file("out.safetensors") +
                          " --tag global_step7 --safetensors");
    ASSERT_EQ(st.exit_code, 0) << st.err;
    EXPECT_EQ(python("check_consolidated " + dir.file("out.pt") + " " +
                     dir.file("out.safetensors") + " " + dir.file("expected.pt")),
              "") << "world size " << world;
  }
  testing::TempDir dir;
  ASSERT_EQ(python("write_zero2 " + dir.path() + " global_step5 2"), "");
  create_directories(dir.file("out"));
  auto r = run_command(kZeroToFp32 + " " + dir.path() + " " + dir.file("out"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto s = run_command(kZeroToFp32 + " " + dir.path() + " " + dir.file("out") + " --safe_serialization");
  ASSERT_EQ(s.exit_code, 0) << s.err;
  EXPECT_EQ(python("check_consolidated " + dir.file("out/pytorch_model.bin") + " " +
                   dir.file("out/model.safetensors") + " " + dir.file("expected.pt")),
            "");
}

TEST(ZeroToFp32Tool, ErrorsNameTheFileAndExitNonZero) {
  testing::TempDir dir;
  testing::write_synthetic_zero_checkpoint(testing::example_checkpoint(3), dir.path(), "t");
  ::unlink((dir.path() + "/t/" + zero_optim_states_file_name(2)).c_str());
  auto r = run_command(kZeroToFp32 + " " + dir.path() + " " + dir.file("o.pt"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("zero_to_fp32: error: " + dir.path() +
                       "/t: expected 3 '*_optim_states.pt' files (partition_count) but found 2; "
                       "missing data-parallel rank(s) 2"),
            std::string::npos)
      << r.err;
  r = run_command(kZeroToFp32 + " " + dir.path() + " " + dir.file("o.pt") + " --max_shard_size 5GB");
  EXPECT_NE(r.err.find("--max_shard_size: sharded output is not implemented"), std::string::npos);
  r = run_command(kZeroToFp32 + " " + dir.path());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("output is required"), std::string::npos) << r.err;
  struct stat st {};
  EXPECT_NE(::stat(dir.file("o.pt").c_str(), &st), 0);  // nothing written
}

// The tool killed while writing (SIGXFSZ at a 64 KiB file-size limit) leaves the previous
// output as it was.
TEST(ZeroToFp32Tool, KilledMidWriteLeavesThePreviousOutput) {
  testing::TempDir dir;
  auto c = testing::example_checkpoint(2);
  c.groups[0].insert("big.weight", testing::known_tensor({300, 300}, 8.0));  // 360 KB
  testing::write_synthetic_zero_checkpoint(c, dir.path(), "t");
  const std::string out = dir.file("model.pt");
  write_file_atomically(out, "previous output");
  auto r = run_command("ulimit -c 0; ulimit -f 64; " + kZeroToFp32 + " " + dir.path() + " " + out);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(read_file(out), "previous output");
  auto ok = run_command(kZeroToFp32 + " " + dir.path() + " " + out);
  ASSERT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_TRUE(at::equal(load(out).toGenericDict().at("big.weight").toTensor(),
                        testing::known_tensor({300, 300}, 8.0)));
}

// OUTPUT may not be a file the tool reads: `latest`, the tag folder or a file in it, also
// through a symlinked folder, a "..", or a hard link. A file beside `latest` is fine.
TEST(ZeroToFp32Tool, RefusesAnOutputThatWouldReplaceTheCheckpoint) {
  testing::TempDir dir;
  testing::write_synthetic_zero_checkpoint(testing::example_checkpoint(2), dir.path(), "t");
  const std::string tag_dir = dir.path() + "/t";
  const std::string model = tag_dir + "/" + model_states_file_name();
  const std::string optim = tag_dir + "/" + zero_optim_states_file_name(1);
  ASSERT_EQ(::symlink(tag_dir.c_str(), dir.file("link").c_str()), 0);
  ASSERT_EQ(::link(optim.c_str(), dir.file("hard.pt").c_str()), 0);
  const std::string model_before = read_file(model), optim_before = read_file(optim);
  for (const std::string output :
       {model, optim, tag_dir, tag_dir + "/", tag_dir + "/new.pt", dir.file("latest"),
        dir.path() + "/t/../t/" + model_states_file_name(), dir.file("link/x.pt"),
        dir.file("link"), dir.file("hard.pt")}) {
    SCOPED_TRACE(output);
    for (const std::string tag_flag : {"", " -t t"}) {
      auto r = run_command(kZeroToFp32 + " " + dir.path() + " " + output + tag_flag);
      EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
      EXPECT_NE(r.err.find("zero_to_fp32: error: output " + output), std::string::npos) << r.err;
      EXPECT_NE(r.err.find("choose an output outside the checkpoint"), std::string::npos)
          << r.err;
    }
  }
  EXPECT_EQ(read_file(model), model_before);
  EXPECT_EQ(read_file(optim), optim_before);
  EXPECT_EQ(read_file(dir.file("latest")), "t");
  struct stat st {};
  EXPECT_NE(::stat((tag_dir + "/new.pt").c_str(), &st), 0);
  EXPECT_NE(::stat((tag_dir + "/pytorch_model.bin").c_str(), &st), 0);
  // DeepSpeed's habit: run in the checkpoint folder, write beside `latest`.
  auto ok = run_command(kZeroToFp32 + " " + dir.path() + " " + dir.path());
  ASSERT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_EQ(::stat(dir.file("pytorch_model.bin").c_str(), &st), 0);
}

// A rank file with a flipped byte, or with a pickle of 10^6 nested lists, fails with the file
// and what is wrong named (it used to consolidate garbage, or overflow the stack).
TEST(ZeroToFp32Tool, CorruptOrHostileRankFilesFailNamingTheFile) {
  testing::TempDir dir;
  testing::write_synthetic_zero_checkpoint(testing::example_checkpoint(2), dir.path(), "t");
  const std::string optim = dir.path() + "/t/" + zero_optim_states_file_name(1);
  std::string bytes = read_file(optim);
  const size_t name = bytes.find("archive/data/0");  // in the first local header
  ASSERT_NE(name, std::string::npos);
  const size_t extra_len = static_cast<uint8_t>(bytes[name - 2]) |
                           (static_cast<uint8_t>(bytes[name - 1]) << 8);
  const size_t data = name + 14 + extra_len;  // the storage's first byte
  bytes[data] = static_cast<char>(bytes[data] ^ 0x01);
  std::ofstream(optim, std::ios::binary | std::ios::trunc) << bytes;
  auto r = run_command(kZeroToFp32 + " " + dir.path() + " " + dir.file("o.pt"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find(optim + ": zip record 'archive/data/0': CRC-32"), std::string::npos)
      << r.err;

  // A data.pkl of 10^6 nested lists (2 MB), written with LibTorch's zip writer.
  const int n = 1000000;
  const std::string bomb = "\x80\x02" + std::string(n, ']') + std::string(n - 1, 'a') + ".";
  {
    caffe2::serialize::PyTorchStreamWriter writer(optim);
    writer.writeRecord("data.pkl", bomb.data(), bomb.size());
    writer.writeEndOfFile();
  }
  r = run_command(kZeroToFp32 + " " + dir.path() + " " + dir.file("o.pt"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find(optim + ": pickle data at byte "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("values nested deeper than 1000 levels"), std::string::npos) << r.err;
  struct stat st {};
  EXPECT_NE(::stat(dir.file("o.pt").c_str(), &st), 0);  // nothing written
}

}  // namespace
}  // namespace deepspeed::checkpoint
