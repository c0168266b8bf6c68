// The `text` stage: tokenizes a text field into int32 ids [max_len] plus a scalar length, with
// `bytes` (each UTF-8 byte is one token) or a byte-level BPE tokenizer.json (Qwen, GPT-2).
// Optional prefix/suffix (chat-template-like wrapping) and appended special ids.
// Outputs: <name> [max_len] int32 (or, dtype: uint8, the bytes), <name>_lengths [] int32.
#include <fmt/format.h>

#include <algorithm>

#include "engine/registry.h"
#include "stages/text/bpe_tokenizer.h"
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
    if ((c & 0xE0) == 0xC0)
      len = 2, min = 0x80;
    else if ((c & 0xF0) == 0xE0)
      len = 3, min = 0x800;
    else if ((c & 0xF8) == 0xF0)
      len = 4, min = 0x10000;
    else
      return i;
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
  DType dtype = DType::kInt32;              // uint8: the UTF-8 bytes themselves (tokenizer: bytes)
  std::shared_ptr<const BpeTokenizer> bpe;  // null: one token per UTF-8 byte
  std::vector<int32_t> prefix, suffix;      // ids wrapped around every sample's text
};

class TextWorker : public StageWorker {
 public:
  explicit TextWorker(const TextParams& p) : p_(p) {}

  // Tokenizing is the whole work, and what a budget counts.
  Status Measure(const SampleContext& ctx, const FieldValue& in, const OutputRow& out) override {
    return Process(ctx, in, out);
  }

  Status Process(const SampleContext& ctx, const FieldValue& in, const OutputRow& out) override {
    MMFEED_ASSIGN_OR_RETURN(std::string_view text, FieldBytes(in, &file_));
    ids_.clear();
    if (p_.bpe) {  // invalid UTF-8 is replaced, as the reference tokenizer does
      p_.bpe->Encode(text, &cache_, &ids_);
    } else {
      size_t bad = FindInvalidUtf8(text);
      if (bad != std::string_view::npos)
        return Status::Corrupt(fmt::format("text is not valid UTF-8 (byte {})", bad));
      for (unsigned char c : text) ids_.push_back(c);
    }
    // prefix + text + suffix; the text is cut (at the configured end) so that both wrappers fit.
    const int64_t room = p_.max_len - static_cast<int64_t>(p_.prefix.size() + p_.suffix.size());
    const int64_t n = std::min<int64_t>(static_cast<int64_t>(ids_.size()), room);
    const size_t start = p_.truncate_left ? ids_.size() - n : 0;
    if (p_.dtype == DType::kUInt8)
      Write(ids_.begin() + start, n, out.As<uint8_t>(0), out.As<int32_t>(1));
    else
      Write(ids_.begin() + start, n, out.As<int32_t>(0), out.As<int32_t>(1));
    return Status::Ok();
  }

 private:
  // prefix + n ids from `ids` + suffix, then pad_id up to max_len.
  template <typename T>
  void Write(std::vector<int32_t>::const_iterator ids, int64_t n, T* d, int32_t* length) const {
    T* w = std::copy(p_.prefix.begin(), p_.prefix.end(), d);
    w = std::copy(ids, ids + n, w);
    w = std::copy(p_.suffix.begin(), p_.suffix.end(), w);
    std::fill(w, d + p_.max_len, static_cast<T>(p_.pad_id));
    *length = static_cast<int32_t>(w - d);
  }

  const TextParams& p_;
  std::string file_;
  std::vector<int32_t> ids_;
  BpeCache cache_;
};

class TextStage : public Stage {
 public:
  explicit TextStage(TextParams p) : p_(std::move(p)) {}
  std::vector<TensorSpec> OutputSpecs() const override {
    return {{p_.name, p_.dtype, {p_.max_len}}, {p_.name + "_lengths", DType::kInt32, {}}};
  }
  std::unique_ptr<StageWorker> NewWorker() const override {
    return std::make_unique<TextWorker>(p_);
  }
  CostOutputs Costs() const override { return {p_.name + "_lengths", ""}; }
  WhyNot WhyNotCacheable() const override { return std::nullopt; }

 private:
  TextParams p_;
};

Result<std::unique_ptr<Stage>> MakeTextStage(const StageArgs& a) {
  TextParams p;
  p.name = a.name;
  const std::string& tok = a.params.GetString("tokenizer");
  if (tok != "bytes") {
    Result<std::shared_ptr<const BpeTokenizer>> bpe =
        BpeTokenizer::Load(ResolvePath(a.base_dir, tok));
    if (!bpe.ok()) return bpe.status();
    p.bpe = *bpe;
  }
  p.max_len = a.params.GetInt("max_len");
  if (p.max_len < 1 || p.max_len > (1 << 24))
    return Status::Invalid("max_len must be in 1..16777216");
  p.pad_id = static_cast<int32_t>(a.params.GetInt("pad_id"));
  p.truncate_left = a.params.GetString("truncation") == "left";
  BpeCache cache;
  auto wrap = [&](const std::string& text, std::vector<int32_t>* ids) {
    if (text.empty()) return;
    if (p.bpe)
      p.bpe->Encode(text, &cache, ids);
    else
      for (unsigned char c : text) ids->push_back(c);
  };
  wrap(a.params.GetString("prefix"), &p.prefix);
  wrap(a.params.GetString("suffix"), &p.suffix);
  for (int64_t v : a.params.GetIntList("add_special")) p.suffix.push_back(static_cast<int32_t>(v));
  if (a.params.GetString("dtype") == "uint8") {
    p.dtype = DType::kUInt8;
    if (p.bpe) return Status::Invalid("dtype: uint8 holds bytes: it needs tokenizer: bytes");
    if (a.params.GetBool("pack"))
      return Status::Invalid("dtype: uint8 cannot be packed (pack: true makes int32 rows)");
    for (int32_t id : p.suffix)
      if (id < 0 || id > 255)
        return Status::Invalid(fmt::format("dtype: uint8: add_special id {} is not a byte", id));
    if (p.pad_id < 0 || p.pad_id > 255)
      return Status::Invalid(fmt::format("dtype: uint8: pad_id {} is not a byte", p.pad_id));
  }
  if (static_cast<int64_t>(p.prefix.size() + p.suffix.size()) >= p.max_len)
    return Status::Invalid(fmt::format("prefix and suffix take {} tokens, max_len is {}",
                                       p.prefix.size() + p.suffix.size(), p.max_len));
  return std::unique_ptr<Stage>(new TextStage(std::move(p)));
}

MMFEED_REGISTER_STAGE((StageSchema{
    "text",
    "tokenize text into ids padded to max_len: one token per UTF-8 byte, or byte-level BPE "
    "from a Hugging Face tokenizer.json. Outputs: <name> [max_len] int32 (dtype: uint8, the "
    "bytes tokenizer's bytes), <name>_lengths [] int32",
    StageKind::kField,
    /*field_is_path=*/false,
    {
        {"tokenizer", ParamType::kString, std::string("bytes"),
         "bytes, or a tokenizer.json / tokenizer.json.gz path (BPE)"},
        Ranged({"max_len", ParamType::kInt, int64_t{128}, "tokens per sample (truncate or pad)"}, 1,
               16777216),
        {"pad_id", ParamType::kInt, int64_t{0}, "id written after the last token"},
        {"truncation",
         ParamType::kString,
         std::string("right"),
         "right | left: which end of the text is cut",
         {"right", "left"}},
        {"prefix", ParamType::kString, std::string(""),
         "text put before every sample (special tokens recognised)"},
        {"suffix", ParamType::kString, std::string(""),
         "text put after every sample (special tokens recognised)"},
        {"add_special", ParamType::kIntList, std::vector<int64_t>{},
         "ids appended after the suffix (e.g. an end-of-text id)"},
        {"pack", ParamType::kBool, false,
         "concatenate samples into full rows of max_len, with <name>_doc_ids marking documents"},
        {"dtype",
         ParamType::kString,
         std::string("int32"),
         "int32 (token ids) | uint8 (tokenizer: bytes only: the UTF-8 bytes, e.g. a caption the "
         "trainer tokenizes)",
         {"int32", "uint8"}},
    },
    MakeTextStage}));

}  // namespace
}  // namespace mmfeed
