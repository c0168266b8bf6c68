#include <gtest/gtest.h>

#include "engine/registry.h"
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
  auto stage =
      testing::MakeStage("text", "text", {{"max_len", int64_t{6}}, {"pad_id", int64_t{-1}}});
  Status st;
  auto out = RunText(*stage, "h\xc3\xa9!", &st);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(out[0].spec.name, "text");
  EXPECT_EQ(out[1].spec.name, "text_lengths");
  const int32_t* ids = out[0].As<int32_t>();
  EXPECT_EQ(std::vector<int32_t>(ids, ids + 6),
            (std::vector<int32_t>{'h', 0xc3, 0xa9, '!', -1, -1}));
  EXPECT_EQ(*out[1].As<int32_t>(), 4);
  out = RunText(*stage, "abcdefghij", &st);
  EXPECT_EQ(*out[1].As<int32_t>(), 6);
  EXPECT_EQ(out[0].As<int32_t>()[5], 'f');
  auto left = testing::MakeStage("text", "text",
                                 {{"max_len", int64_t{3}}, {"truncation", std::string("left")}});
  out = RunText(*left, "abcdef", &st);
  EXPECT_EQ(out[0].As<int32_t>()[0], 'd');
}

// dtype: uint8 gives the UTF-8 bytes themselves (a caption for a trainer-side tokenizer), with
// non-ASCII bytes in the prefix kept as bytes.
TEST(TextStageTest, Uint8HoldsTheBytesWithTheirLength) {
  auto stage = testing::MakeStage("text", "caption",
                                  {{"max_len", int64_t{8}},
                                   {"dtype", std::string("uint8")},
                                   {"prefix", std::string("\xc3\xa9")}});
  Status st;
  auto out = RunText(*stage, "ab\xe2\x82\xac", &st);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(out[0].spec.dtype, DType::kUInt8);
  EXPECT_EQ(out[0].spec.NumBytes(), 8u);
  const uint8_t* b = out[0].As<uint8_t>();
  EXPECT_EQ(std::vector<uint8_t>(b, b + 8),
            (std::vector<uint8_t>{0xc3, 0xa9, 'a', 'b', 0xe2, 0x82, 0xac, 0}));
  EXPECT_EQ(*out[1].As<int32_t>(), 7);
  auto args = [](std::map<std::string, ParamValue> over) {
    over.emplace("dtype", std::string("uint8"));
    return testing::BuildStage("text", "t", over).status();
  };
  EXPECT_NE(args({{"pad_id", int64_t{256}}}).message().find("pad_id 256 is not a byte"),
            std::string::npos);
  EXPECT_NE(args({{"pack", true}}).message().find("cannot be packed"), std::string::npos);
  EXPECT_NE(args({{"add_special", std::vector<int64_t>{151643}}}).message().find("not a byte"),
            std::string::npos);
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
  EXPECT_EQ(FindInvalidUtf8("a\xc0\xaf"), 1u);         // overlong '/'
  EXPECT_EQ(FindInvalidUtf8("ab\xed\xa0\x80"), 2u);    // surrogate
  EXPECT_EQ(FindInvalidUtf8("abc\xe4\xb8"), 3u);       // cut short
  EXPECT_EQ(FindInvalidUtf8("\xf4\x90\x80\x80"), 0u);  // above U+10FFFF
}

}  // namespace
}  // namespace mmfeed
