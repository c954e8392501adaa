// The GGUF reader's dequantisation against gguf-py's, bit for bit, in every block format it
// decodes: gguf_dequantize_reference.py writes random tensors of each type with gguf-py's
// GGUFWriter and gguf-py's dequantization of each beside it; we read the file and compare. The
// Python environment comes from the CTest fixture llama_python_refs (scripts/setup_python_refs.sh).
#include <filesystem>
#include <set>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "gguf_dequantize.h"
#include "gguf_file.h"
#include "support/run_command.h"
#include "support/temp_dir.h"

namespace deepspeed::examples {
namespace {

using testing::run_command;
using testing::TempDir;

const std::string kPython = std::string(DS_SOURCE_DIR) + "/.venv/bin/python";

TEST(GgufDequantizeParity, EveryDecodedTypeEqualsGgufPyBitForBit) {
  ASSERT_TRUE(std::filesystem::exists(kPython)) << kPython << " (run scripts/setup_python_refs.sh)";
  TempDir dir("gguf_dequantize_parity");
  const std::string file = dir.file("types.gguf");
  const auto r = run_command(kPython + " " + DS_GGUF_DEQUANTIZE_REFERENCE_PY + " '" + file + "' 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;

  const auto f = GgufFile::open(file);
  std::set<std::string> compared;
  for (const auto& t : f.tensors()) {
    if (t.name.find(".expected") != std::string::npos) continue;
    SCOPED_TRACE(t.name);
    EXPECT_EQ(t.name, ggml_type_name(t.type));
    const auto got = f.load_tensor(t.name, at::kFloat);
    const auto want = f.load_tensor(t.name + ".expected", at::kFloat);
    ASSERT_EQ(got.sizes(), want.sizes());
    ASSERT_TRUE(torch::isfinite(want).all().item<bool>());
    // Bit patterns, so that -0.0 against 0.0 counts too.
    const auto differ = got.view(at::kInt).ne(want.view(at::kInt)).flatten();
    if (differ.any().item<bool>()) {
      const int64_t i = differ.nonzero()[0].item<int64_t>();
      ADD_FAILURE() << differ.sum().item<int64_t>() << " values differ; the first, flat index "
                    << i << ": " << got.flatten()[i].item<float>() << " against "
                    << want.flatten()[i].item<float>();
    }
    compared.insert(t.name);
  }
  const std::set<std::string> all = {"F16",  "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1",   "Q8_0",
                                     "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS"};
  EXPECT_EQ(compared, all);
}

}  // namespace
}  // namespace deepspeed::examples
