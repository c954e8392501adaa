// Tests for LinePrefixer (tools/deepspeed/line_prefixer.cpp): whole prefixed lines out of
// arbitrarily chunked input.
#include "line_prefixer.h"

#include <gtest/gtest.h>

namespace deepspeed::launcher {
namespace {

TEST(LinePrefixer, CompleteLines_ArePrefixedEach) {
  LinePrefixer p(rank_prefix(3));
  EXPECT_EQ(p.feed("a\nbb\n"), "[rank 3] a\n[rank 3] bb\n");
  EXPECT_FALSE(p.has_partial());
  EXPECT_EQ(p.flush(), "");
}

TEST(LinePrefixer, PartialLine_IsHeldUntilCompleted) {
  LinePrefixer p("[rank 0] ");
  EXPECT_EQ(p.feed("hel"), "");
  EXPECT_TRUE(p.has_partial());
  EXPECT_EQ(p.feed("lo"), "");
  EXPECT_EQ(p.feed(" world\nnext"), "[rank 0] hello world\n");
  EXPECT_EQ(p.feed("\n"), "[rank 0] next\n");
}

TEST(LinePrefixer, FinalLineWithoutNewline_IsFlushedWithOne) {
  LinePrefixer p("[rank 1] ");
  EXPECT_EQ(p.feed("done\nbye"), "[rank 1] done\n");
  EXPECT_EQ(p.flush(), "[rank 1] bye\n");
  EXPECT_EQ(p.flush(), "") << "flush empties the pending line";
}

TEST(LinePrefixer, EmptyLines_AreKept) {
  LinePrefixer p("> ");
  EXPECT_EQ(p.feed("\n\nx\n"), "> \n> \n> x\n");
}

TEST(LinePrefixer, ByteAtATime_SameAsOneChunk) {
  const std::string text = "first line\nsecond\n\nthird without newline";
  LinePrefixer whole("[rank 2] ");
  LinePrefixer bytes("[rank 2] ");
  std::string a = whole.feed(text);
  a += whole.flush();
  std::string b;
  for (char c : text) b += bytes.feed(std::string_view(&c, 1));
  b += bytes.flush();
  EXPECT_EQ(a, b);
  EXPECT_EQ(a, "[rank 2] first line\n[rank 2] second\n[rank 2] \n[rank 2] third without newline\n");
}

TEST(LinePrefixer, OverlongLine_IsEmittedInBoundedPieces) {
  LinePrefixer p("> ", 4);
  EXPECT_EQ(p.feed("abcdefghij"), "> abcd\n> efgh\n");
  EXPECT_EQ(p.feed("k\n"), "> ijk\n");
  EXPECT_EQ(p.feed("0123"), "> 0123\n");
  EXPECT_FALSE(p.has_partial());
}

TEST(LinePrefixer, CarriageReturn_IsPassedThrough) {
  LinePrefixer p("> ");
  EXPECT_EQ(p.feed("a\r\n"), "> a\r\n");
}

}  // namespace
}  // namespace deepspeed::launcher
