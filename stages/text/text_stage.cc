// The `text` stage: tokenizes a text field into int32 ids [max_len] plus a scalar length.
// The tokenizer today is `bytes` (each UTF-8 byte is one token); the BPE tokenizer plugs in
// behind the same parameters. Outputs: <name> [max_len] int32, <name>_lengths [] int32.
#include <fmt/format.h>

#include <algorithm>

#include "stages/runtime/registry.h"
#include "stages/text/utf8.h"

namespace mmfeed {

size_t FindInvalidUtf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size(), i = 0;
  while (i < n) {
    unsigned char c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    int len;
    uint32_t min;
    if ((c & 0xE0) == 0xC0) len = 2, min = 0x80;
    else if ((c & 0xF0) == 0xE0) len = 3, min = 0x800;
    else if ((c & 0xF8) == 0xF0) len = 4, min = 0x10000;
    else return i;
    if (i + len > n) return i;
    uint32_t cp = c & (0x7F >> len);
    for (int k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += len;
  }
  return std::string_view::npos;
}

namespace {

struct TextParams {
  std::string name;
  int64_t max_len = 128;
  int32_t pad_id = 0;
  bool truncate_left = false;
};

class BytesWorker : public StageWorker {
 public:
  explicit BytesWorker(const TextParams& p) : p_(p) {}

  Status Process(const SampleContext& ctx, const FieldValue& in, const OutputRow& out) override {
    Result<std::string_view> text = FieldBytes(in, &file_);
    if (!text.ok()) return text.status();
    size_t bad = FindInvalidUtf8(*text);
    if (bad != std::string_view::npos) return Status::Corrupt(fmt::format("text is not valid UTF-8 (byte {})", bad));
    int64_t n = std::min<int64_t>(static_cast<int64_t>(text->size()), p_.max_len);
    size_t start = p_.truncate_left ? text->size() - n : 0;
    int32_t* d = out.As<int32_t>(0);
    for (int64_t i = 0; i < n; ++i) d[i] = static_cast<unsigned char>((*text)[start + i]);
    std::fill(d + n, d + p_.max_len, p_.pad_id);
    *out.As<int32_t>(1) = static_cast<int32_t>(n);
    return Status::Ok();
  }

 private:
  const TextParams& p_;
  std::string file_;
};

class TextStage : public Stage {
 public:
  explicit TextStage(TextParams p) : p_(std::move(p)) {}
  std::vector<TensorSpec> OutputSpecs() const override {
    return {{p_.name, DType::kInt32, {p_.max_len}}, {p_.name + "_lengths", DType::kInt32, {}}};
  }
  std::unique_ptr<StageWorker> NewWorker() const override { return std::make_unique<BytesWorker>(p_); }

 private:
  TextParams p_;
};

Result<std::unique_ptr<Stage>> MakeTextStage(const StageArgs& a) {
  TextParams p;
  p.name = a.name;
  const std::string& tok = a.params.GetString("tokenizer");
  if (tok != "bytes")
    return Status::Unsupported(fmt::format("tokenizer '{}' is not supported yet; use 'bytes'", tok));
  p.max_len = a.params.GetInt("max_len");
  if (p.max_len < 1 || p.max_len > (1 << 24)) return Status::Invalid("max_len must be in 1..16777216");
  p.pad_id = static_cast<int32_t>(a.params.GetInt("pad_id"));
  p.truncate_left = a.params.GetString("truncation") == "left";
  return std::unique_ptr<Stage>(new TextStage(std::move(p)));
}

MMFEED_REGISTER_STAGE((StageSchema{
    "text",
    "tokenize UTF-8 text into int32 ids padded to max_len. Outputs: <name> [max_len], <name>_lengths []",
    StageKind::kField,
    /*field_is_path=*/false,
    {
        {"tokenizer", ParamType::kString, std::string("bytes"), "bytes: one token per UTF-8 byte"},
        {"max_len", ParamType::kInt, int64_t{128}, "tokens per sample (truncate or pad)"},
        {"pad_id", ParamType::kInt, int64_t{0}, "id written after the last token"},
        {"truncation", ParamType::kString, std::string("right"), "right | left: which end is cut", {"right", "left"}},
    },
    MakeTextStage}));

}  // namespace
}  // namespace mmfeed
