// Tests for --world_info encoding (tools/deepspeed/world_info.cpp): DeepSpeed's wire form
// (url-safe base64 of a JSON object in rank order) and decoding errors.
#include "world_info.h"

#include <gtest/gtest.h>

#include "expect_usage.h"

namespace deepspeed::launcher {
namespace {

using testing::expect_usage_error;

TEST(WorldInfo, EncodesAsDeepSpeedDoes) {
  // Python: base64.urlsafe_b64encode(json.dumps({"worker-1": [0, 1], "worker-0": [2]}, separators=(",", ":")))
  WorldInfo world = {{"worker-1", {0, 1}}, {"worker-0", {2}}};
  EXPECT_EQ(base64_decode(encode_world_info(world)), R"({"worker-1":[0,1],"worker-0":[2]})");
  EXPECT_EQ(encode_world_info(world), "eyJ3b3JrZXItMSI6WzAsMV0sIndvcmtlci0wIjpbMl19");
}

TEST(WorldInfo, RoundTripKeepsHostOrder) {
  WorldInfo world = {{"z", {0}}, {"a", {1, 3}}, {"m", {0, 1, 2}}};
  WorldInfo back = decode_world_info(encode_world_info(world));
  ASSERT_EQ(back.size(), 3u);
  EXPECT_EQ(describe_world(back), "z:0@a:1,3@m:0,1,2");
  EXPECT_EQ(world_size(back), 6);
  EXPECT_EQ(first_rank_of_node(back, 0), 0);
  EXPECT_EQ(first_rank_of_node(back, 2), 3);
}

TEST(WorldInfo, DecodesDeepSpeedsSpacedJsonAndEitherAlphabet) {
  // json.dumps default separators (", ", ": "), as DeepSpeed's runner writes them.
  const std::string json = R"({"localhost": [0, 1]})";
  WorldInfo world = decode_world_info(base64_url_encode(json));
  EXPECT_EQ(describe_world(world), "localhost:0,1");
  std::string unpadded = base64_url_encode(json);
  while (!unpadded.empty() && unpadded.back() == '=') unpadded.pop_back();
  EXPECT_EQ(describe_world(decode_world_info(unpadded)), "localhost:0,1");
}

TEST(Base64, MatchesRfc4648Vectors) {
  EXPECT_EQ(base64_url_encode(""), "");
  EXPECT_EQ(base64_url_encode("f"), "Zg==");
  EXPECT_EQ(base64_url_encode("fo"), "Zm8=");
  EXPECT_EQ(base64_url_encode("foo"), "Zm9v");
  EXPECT_EQ(base64_url_encode("foobar"), "Zm9vYmFy");
  EXPECT_EQ(base64_url_encode("\xfb\xff"), "-_8=") << "url-safe alphabet";
  EXPECT_EQ(base64_decode("-_8="), "\xfb\xff");
  EXPECT_EQ(base64_decode("+/8="), "\xfb\xff");
}

TEST(WorldInfo, BadInput_IsAUsageErrorNamingTheFlag) {
  expect_usage_error([] { decode_world_info("not base64!"); }, {"--world_info", "' ' at offset 3 is not base64"});
  expect_usage_error([] { decode_world_info(base64_url_encode("[1,2]")); }, {"--world_info", "names no hosts"});
  expect_usage_error([] { decode_world_info(base64_url_encode("{}")); }, {"names no hosts"});
  expect_usage_error([] { decode_world_info(base64_url_encode("{\"a\": []}")); }, {"host 'a' has no slot list"});
  expect_usage_error([] { decode_world_info(base64_url_encode("{\"a\": [-1]}")); }, {"host 'a' has slot -1"});
  expect_usage_error([] { decode_world_info(base64_url_encode("{\"a\": [0]")); }, {"which is not JSON"});
}

}  // namespace
}  // namespace deepspeed::launcher
