// SHA-256 against FIPS 180-4 test vectors, and the committed GPT-2 vocabulary files against the
// hashes in third_party/gpt2_bpe/README.md (which tiktoken pins for OpenAI's originals).
#include "sha256.h"

#include <gtest/gtest.h>

#include "text_test_util.h"

namespace deepspeed::examples {
namespace {

using testing::slurp;

TEST(Sha256, KnownVectors) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(sha256_hex(std::string(1000000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, IncrementalEqualsOneShotAcrossBlockBoundaries) {
  std::string data;
  for (int i = 0; i < 1000; ++i) data.push_back(static_cast<char>(i * 37));
  for (size_t split : {0, 1, 55, 56, 63, 64, 65, 127, 128, 999}) {
    Sha256 h;
    h.update(std::string_view(data).substr(0, split));
    h.update(std::string_view(data).substr(split));
    EXPECT_EQ(to_hex(h.digest()), sha256_hex(data)) << "split at " << split;
  }
}

// "    sha256 <file> <hex>" in the README.
std::string readme_hash(const std::string& readme, const std::string& file) {
  const std::string key = "sha256 " + file;
  const size_t at = readme.find(key);
  if (at == std::string::npos) return "(not in README)";
  size_t hex = readme.find_first_not_of(' ', at + key.size());
  return readme.substr(hex, 64);
}

TEST(Sha256, VocabularyFilesMatchReadme) {
  const std::string dir = DS_GPT2_BPE_DIR;
  const std::string readme = slurp(dir + "/README.md");
  for (const std::string file : {"encoder.json", "vocab.bpe"}) {
    EXPECT_EQ(sha256_hex(slurp(dir + "/" + file)), readme_hash(readme, file)) << file;
  }
  // OpenAI's originals, as pinned in tiktoken_ext/openai_public.py.
  EXPECT_EQ(readme_hash(readme, "encoder.json"),
            "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783");
  EXPECT_EQ(readme_hash(readme, "vocab.bpe"),
            "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5");
}

}  // namespace
}  // namespace deepspeed::examples
