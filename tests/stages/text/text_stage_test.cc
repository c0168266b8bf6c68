#include <gtest/gtest.h>

#include "stages/text/utf8.h"
#include "tests/stage_util.h"

namespace mmfeed {
namespace {

std::vector<testing::Output> RunText(const Stage& stage, const std::string& text, Status* st) {
  FieldValue f;
  f.data = text;
  Result<std::vector<testing::Output>> out = testing::RunStage(stage, {0, 0, "id", "test"}, f);
  *st = out.status();
  return out.ok() ? std::move(out.value()) : std::vector<testing::Output>();
}

TEST(TextStageTest, BytesArePaddedAndTruncated) {
  auto stage = testing::MakeStage("text", "text", {{"max_len", int64_t{6}}, {"pad_id", int64_t{-1}}});
  Status st;
  auto out = RunText(*stage, "h\xc3\xa9!", &st);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(out[0].spec.name, "text");
  EXPECT_EQ(out[1].spec.name, "text_lengths");
  const int32_t* ids = out[0].As<int32_t>();
  EXPECT_EQ(std::vector<int32_t>(ids, ids + 6), (std::vector<int32_t>{'h', 0xc3, 0xa9, '!', -1, -1}));
  EXPECT_EQ(*out[1].As<int32_t>(), 4);
  out = RunText(*stage, "abcdefghij", &st);
  EXPECT_EQ(*out[1].As<int32_t>(), 6);
  EXPECT_EQ(out[0].As<int32_t>()[5], 'f');
  auto left = testing::MakeStage("text", "text", {{"max_len", int64_t{3}}, {"truncation", std::string("left")}});
  out = RunText(*left, "abcdef", &st);
  EXPECT_EQ(out[0].As<int32_t>()[0], 'd');
}

TEST(TextStageTest, InvalidUtf8IsAnError) {
  auto stage = testing::MakeStage("text", "text", {});
  Status st;
  RunText(*stage, "ok \xff bad", &st);
  EXPECT_EQ(st.code(), Status::Code::kCorrupt);
  EXPECT_NE(st.message().find("byte 3"), std::string::npos);
}

TEST(Utf8Test, RejectsOverlongSurrogatesAndTruncation) {
  EXPECT_EQ(FindInvalidUtf8("plain ascii"), std::string_view::npos);
  EXPECT_EQ(FindInvalidUtf8("\xe4\xb8\xad\xf0\x9f\x98\x80"), std::string_view::npos);
  EXPECT_EQ(FindInvalidUtf8("a\xc0\xaf"), 1u);          // overlong '/'
  EXPECT_EQ(FindInvalidUtf8("ab\xed\xa0\x80"), 2u);     // surrogate
  EXPECT_EQ(FindInvalidUtf8("abc\xe4\xb8"), 3u);        // cut short
  EXPECT_EQ(FindInvalidUtf8("\xf4\x90\x80\x80"), 0u);   // above U+10FFFF
}

}  // namespace
}  // namespace mmfeed
