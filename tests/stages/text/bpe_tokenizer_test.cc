#include "stages/text/bpe_tokenizer.h"

#include <gtest/gtest.h>
#include <unicode/normalizer2.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "tests/stage_util.h"
#include "tests/test_util.h"

namespace mmfeed {
namespace {

using testing::TestData;

std::shared_ptr<const BpeTokenizer> Qwen() {
  static std::shared_ptr<const BpeTokenizer> tok = [] {
    auto t = BpeTokenizer::Load(TestData("tokenizer/qwen3-tokenizer.json.gz"));
    EXPECT_TRUE(t.ok()) << t.status().message();
    return t.ok() ? *t : nullptr;
  }();
  return tok;
}

std::vector<std::string> Lines(const std::string& path) {
  std::string all = testing::ReadFile(path);
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t i = 0; i < all.size(); ++i)
    if (all[i] == '\n') {
      lines.push_back(all.substr(start, i - start));
      start = i + 1;
    }
  return lines;
}

// Every line of the 6,000-line corpus must give exactly the ids Hugging Face tokenizers gave.
TEST(BpeTokenizerTest, MatchesHuggingFaceOnTheWholeCorpus) {
  auto tok = Qwen();
  ASSERT_TRUE(tok);
  std::vector<std::string> corpus = Lines(TestData("tokenizer/corpus.txt"));
  std::vector<std::string> reference = Lines(TestData("tokenizer/reference_ids.jsonl"));
  ASSERT_EQ(corpus.size(), 6000u);
  ASSERT_EQ(reference.size(), corpus.size());
  BpeCache cache(512);  // small, so eviction is exercised too
  int mismatches = 0;
  for (size_t i = 0; i < corpus.size(); ++i) {
    std::vector<int32_t> ids;
    tok->Encode(corpus[i], &cache, &ids);
    std::vector<int32_t> want = nlohmann::json::parse(reference[i]).get<std::vector<int32_t>>();
    if (ids != want && ++mismatches <= 5)
      ADD_FAILURE() << "line " << i + 1 << ": " << corpus[i].substr(0, 80) << "\n ours "
                    << nlohmann::json(ids).dump() << "\n ref  " << reference[i];
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(BpeTokenizerTest, DecodeRoundTripsToTheNormalizedText) {
  auto tok = Qwen();
  ASSERT_TRUE(tok);
  UErrorCode err = U_ZERO_ERROR;
  const icu::Normalizer2* nfc = icu::Normalizer2::getNFCInstance(err);
  BpeCache cache;
  int checked = 0;
  for (const std::string& line : Lines(TestData("tokenizer/corpus.txt"))) {
    std::string text = ReplaceInvalidUtf8(line), want;
    icu::StringByteSink<std::string> sink(&want);
    nfc->normalizeUTF8(0, icu::StringPiece(text.data(), static_cast<int32_t>(text.size())), sink,
                       nullptr, err);
    std::vector<int32_t> ids;
    tok->Encode(line, &cache, &ids);
    ASSERT_EQ(tok->Decode(ids), want) << line;
    ++checked;
  }
  EXPECT_EQ(checked, 6000);
}

TEST(BpeTokenizerTest, InvalidUtf8IsReplacedLikeAWhatwgDecoder) {
  EXPECT_EQ(ReplaceInvalidUtf8("ok"), "ok");
  EXPECT_EQ(ReplaceInvalidUtf8("\xff"), "\xef\xbf\xbd");
  EXPECT_EQ(ReplaceInvalidUtf8("\xe4\xb8"), "\xef\xbf\xbd");              // cut short: one
  EXPECT_EQ(ReplaceInvalidUtf8("\xc0\xaf"), "\xef\xbf\xbd\xef\xbf\xbd");  // overlong: two
  EXPECT_EQ(ReplaceInvalidUtf8("\xed\xa0\x80"),
            "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");  // surrogate
  EXPECT_EQ(ReplaceInvalidUtf8("\xc3\x28"), "\xef\xbf\xbd(");
  EXPECT_EQ(ReplaceInvalidUtf8("\xf0\x9f\x98\x80"), "\xf0\x9f\x98\x80");
}

TEST(BpeTokenizerTest, SpecialTokensAreMatchedBeforeSplitting) {
  auto tok = Qwen();
  ASSERT_TRUE(tok);
  BpeCache cache;
  std::vector<int32_t> ids;
  tok->Encode("<|im_start|>user\nhi<|im_end|>", &cache, &ids);
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(ids.front(), tok->TokenId("<|im_start|>"));
  EXPECT_EQ(ids.back(), tok->TokenId("<|im_end|>"));
  EXPECT_EQ(tok->TokenId("<|im_start|>"), 151644);
  EXPECT_EQ(tok->vocab_size(), 151669u);
}

TEST(BpeTokenizerTest, UnsupportedOrBrokenFilesAreClearErrors) {
  testing::TempDir dir;
  auto error = [&](const std::string& name, const std::string& content) {
    testing::WriteFile(dir / name, content);
    auto t = BpeTokenizer::Load(dir / name);
    return t.ok() ? std::string("loaded") : t.status().message();
  };
  EXPECT_NE(BpeTokenizer::Load(dir / "none.json").status().message().find("none.json: cannot open"),
            std::string::npos);
  EXPECT_NE(error("a.json", "{not json").find("a.json: not a JSON tokenizer file"),
            std::string::npos);
  EXPECT_NE(error("b.json", R"({"model": {"type": "WordPiece", "vocab": {}}})")
                .find("b.json: unsupported tokenizer: model type 'WordPiece'"),
            std::string::npos);
  std::string split =
      R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "normalizer": null,
    "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
      {"type": "Split", "pattern": {"Regex": "\\w+"}, "behavior": "Isolated", "invert": false},
      {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}]}})";
  EXPECT_NE(error("c.json", split).find("unsupported tokenizer: pre_tokenizer Split regex \\w+"),
            std::string::npos)
      << error("c.json", split);
  std::string nfkc =
      R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "normalizer": {"type": "NFKC"}})";
  EXPECT_NE(error("d.json", nfkc).find("unsupported tokenizer: normalizer"), std::string::npos);
  // Fields of the wrong JSON type make the JSON library throw: a clear error, not a crash.
  EXPECT_NE(error("e.json", R"({"model": {"type": 5}})").find("e.json: malformed tokenizer file"),
            std::string::npos)
      << error("e.json", R"({"model": {"type": 5}})");
  EXPECT_NE(error("f.json", R"({"model": {"type": "BPE", "byte_fallback": "yes"}})")
                .find("malformed tokenizer file"),
            std::string::npos);
}

// A GPT-2 style file: ByteLevel with its own regex; a tiny vocabulary checks the split and merges.
TEST(BpeTokenizerTest, Gpt2StylePreTokenizer) {
  nlohmann::json vocab = nlohmann::json::object();  // the 256 byte tokens, then " h", " hi"
  int next = 256, id = 0;
  std::vector<std::string> byte_str(256);
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    int cp = printable ? b : next++;
    std::string s;
    if (cp < 0x80)
      s.push_back(static_cast<char>(cp));
    else {
      s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
    byte_str[b] = s;
    vocab[s] = id++;
  }
  const std::string sp = byte_str[' '];
  vocab[sp + "h"] = id++;
  vocab[sp + "hi"] = id++;
  nlohmann::json j = {
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", {sp + " h", sp + "h i"}}}},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"decoder", {{"type", "ByteLevel"}}}};
  testing::TempDir dir;
  testing::WriteFile(dir / "gpt2.json", j.dump());
  auto tok = BpeTokenizer::Load(dir / "gpt2.json");
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  BpeCache cache;
  std::vector<int32_t> ids;
  (*tok)->Encode("a hi  hi's", &cache, &ids);
  // Pieces: "a", " hi", " ", " hi", "'s"; " hi" merges to one token, "'s" has no merge.
  const int32_t hi = vocab[sp + "hi"];
  EXPECT_EQ(ids, (std::vector<int32_t>{vocab["a"], hi, vocab[sp], hi, vocab["'"], vocab["s"]}));
}

TEST(TextStageTest, BpeWithPrefixSuffixAndSpecialIds) {
  auto stage = testing::MakeStage("text", "text",
                                  {{"tokenizer", TestData("tokenizer/qwen3-tokenizer.json.gz")},
                                   {"max_len", int64_t{12}},
                                   {"prefix", std::string("<|im_start|>user\n")},
                                   {"suffix", std::string("<|im_end|>")},
                                   {"add_special", std::vector<int64_t>{151643}},
                                   {"pad_id", int64_t{-1}}});
  ASSERT_TRUE(stage);
  FieldValue f;
  f.data = "Hello world! This text is far too long to fit";
  auto out = testing::RunStage(*stage, {0, 0, "id", "t"}, f);
  ASSERT_TRUE(out.ok()) << out.status().message();
  const int32_t* ids = (*out)[0].As<int32_t>();
  EXPECT_EQ(ids[0], 151644);
  EXPECT_EQ(ids[1], 872);   // "user"
  EXPECT_EQ(ids[2], 198);   // "\n"
  EXPECT_EQ(ids[3], 9707);  // "Hello": the text is cut on the right, the wrappers stay
  EXPECT_EQ(ids[10], 151645);
  EXPECT_EQ(ids[11], 151643);
  EXPECT_EQ(*(*out)[1].As<int32_t>(), 12);
}

}  // namespace
}  // namespace mmfeed
