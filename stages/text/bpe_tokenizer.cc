#include "stages/text/bpe_tokenizer.h"

#include <fmt/format.h>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <zlib.h>

#include <algorithm>
#include <nlohmann/json.hpp>

namespace mmfeed {
namespace {

constexpr const char* kQwenRegex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+";

Result<std::string> ReadMaybeGzip(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");  // reads plain files as they are
  if (!f)
    return Status::NotFound(fmt::format(
        "{}: cannot open tokenizer file (a relative path is read from the config's folder)", path));
  std::string out;
  char buf[1 << 16];
  int n;
  while ((n = gzread(f, buf, sizeof(buf))) > 0) out.append(buf, n);
  int err = 0;
  const char* msg = gzerror(f, &err);
  gzclose(f);
  if (n < 0 || (err != Z_OK && err != Z_STREAM_END))
    return Status::Io(fmt::format("{}: read failed: {}", path, msg));
  return out;
}

// GPT-2's byte <-> printable character table (bytes_to_unicode in the reference).
std::vector<int> ByteToCodepoint() {
  std::vector<int> table(256, -1);
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    table[b] = printable ? b : next++;
  }
  return table;
}

// Decodes one code point of valid UTF-8 at s[i]; advances i.
uint32_t NextCodepoint(std::string_view s, size_t* i) {
  unsigned char c = s[*i];
  int len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
  uint32_t cp = len == 1 ? c : c & (0x7F >> len);
  for (int k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[*i + k]) & 0x3F);
  *i += len;
  return cp;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// Character classes the pre-tokenizer regexes use.
enum : uint8_t { kLetter = 1, kNumber = 2, kSpace = 4, kCrLf = 8 };

uint8_t Classify(uint32_t cp) {
  uint8_t c = 0;
  if (cp < 0x80) {
    if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') return kLetter;
    if (cp >= '0' && cp <= '9') return kNumber;
    if (cp == '\r' || cp == '\n') return kSpace | kCrLf;
    if (cp == ' ' || (cp >= 0x09 && cp <= 0x0D)) return kSpace;
    return 0;
  }
  int8_t t = u_charType(static_cast<UChar32>(cp));
  if (t >= U_UPPERCASE_LETTER && t <= U_OTHER_LETTER) c |= kLetter;
  if (t == U_DECIMAL_DIGIT_NUMBER || t == U_LETTER_NUMBER || t == U_OTHER_NUMBER) c |= kNumber;
  if (u_isUWhiteSpace(static_cast<UChar32>(cp))) c |= kSpace;
  return c;
}

struct Cp {
  uint32_t cp;
  uint8_t cls;
  uint32_t offset;  // byte offset in the segment
};

bool FoldEq(uint32_t cp, char lower) {
  if (cp < 0x80) return static_cast<char>(cp | 0x20) == lower;
  return lower == 's' && cp == 0x17F;  // LATIN SMALL LETTER LONG S folds to 's'
}

// Length in code points of the contraction ('s, 't, 're, 've, 'm, 'll, 'd) at i, or 0.
size_t Contraction(const std::vector<Cp>& c, size_t i, bool ignore_case) {
  if (c[i].cp != '\'' || i + 1 >= c.size()) return 0;
  auto eq = [&](size_t k, char ch) {
    return k < c.size() &&
           (ignore_case ? FoldEq(c[k].cp, ch) : c[k].cp == static_cast<uint32_t>(ch));
  };
  if (eq(i + 1, 's') || eq(i + 1, 't') || eq(i + 1, 'm') || eq(i + 1, 'd')) return 2;
  if ((eq(i + 1, 'r') && eq(i + 2, 'e')) || (eq(i + 1, 'v') && eq(i + 2, 'e')) ||
      (eq(i + 1, 'l') && eq(i + 2, 'l')))
    return 3;
  return 0;
}

size_t SpaceRunEnd(const std::vector<Cp>& c, size_t i) {
  while (i < c.size() && (c[i].cls & kSpace)) ++i;
  return i;
}

// \s+(?!\S)|\s+ : the run, minus its last character when a non-space follows.
size_t TrailingSpaces(const std::vector<Cp>& c, size_t i) {
  size_t j = SpaceRunEnd(c, i);
  if (j < c.size() && j - i > 1) return j - 1;
  return j;
}

// Qwen2/Qwen3 (and GPT-4o-style) pattern; returns the end of the piece starting at i.
size_t MatchQwen(const std::vector<Cp>& c, size_t i) {
  const size_t n = c.size();
  if (size_t k = Contraction(c, i, true)) return i + k;
  {  // [^\r\n\p{L}\p{N}]?\p{L}+
    size_t j = i;
    if (!(c[j].cls & (kCrLf | kLetter | kNumber)) && j + 1 < n && (c[j + 1].cls & kLetter)) ++j;
    if (c[j].cls & kLetter) {
      while (j < n && (c[j].cls & kLetter)) ++j;
      return j;
    }
  }
  if (c[i].cls & kNumber) return i + 1;  // \p{N}
  {                                      // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
    size_t j = i + (c[i].cp == ' ' ? 1 : 0);
    size_t k = j;
    while (k < n && !(c[k].cls & (kSpace | kLetter | kNumber))) ++k;
    if (k > j) {
      while (k < n && (c[k].cls & kCrLf)) ++k;
      return k;
    }
  }
  {  // \s*[\r\n]+
    size_t j = SpaceRunEnd(c, i);
    for (size_t k = j; k > i; --k)
      if (c[k - 1].cls & kCrLf) return k;
  }
  if (c[i].cls & kSpace) return TrailingSpaces(c, i);
  return i + 1;  // unreachable for valid input: every character matches some branch
}

// GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
size_t MatchGpt2(const std::vector<Cp>& c, size_t i) {
  const size_t n = c.size();
  if (size_t k = Contraction(c, i, false)) return i + k;
  size_t j = i + (c[i].cp == ' ' ? 1 : 0);
  for (uint8_t cls : {kLetter, kNumber}) {
    if (j < n && (c[j].cls & cls)) {
      size_t k = j;
      while (k < n && (c[k].cls & cls)) ++k;
      return k;
    }
  }
  size_t k = j;
  while (k < n && !(c[k].cls & (kSpace | kLetter | kNumber))) ++k;
  if (k > j) return k;
  if (c[i].cls & kSpace) return TrailingSpaces(c, i);
  return i + 1;
}

}  // namespace

std::string ReplaceInvalidUtf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t need = 0, seen = 0;
  uint32_t cp = 0;
  unsigned char lower = 0x80, upper = 0xBF;
  for (size_t i = 0; i < s.size();) {
    unsigned char b = s[i];
    if (need == 0) {
      ++i;
      if (b < 0x80)
        out.push_back(static_cast<char>(b));
      else if (b >= 0xC2 && b <= 0xDF)
        need = 1, cp = b & 0x1F;
      else if (b >= 0xE0 && b <= 0xEF)
        need = 2, cp = b & 0x0F, lower = b == 0xE0 ? 0xA0 : 0x80, upper = b == 0xED ? 0x9F : 0xBF;
      else if (b >= 0xF0 && b <= 0xF4)
        need = 3, cp = b & 0x07, lower = b == 0xF0 ? 0x90 : 0x80, upper = b == 0xF4 ? 0x8F : 0xBF;
      else
        AppendUtf8(0xFFFD, &out);
      continue;
    }
    if (b < lower || b > upper) {  // ill-formed: one U+FFFD, then look at this byte afresh
      need = seen = 0;
      lower = 0x80, upper = 0xBF;
      AppendUtf8(0xFFFD, &out);
      continue;
    }
    ++i;
    lower = 0x80, upper = 0xBF;
    cp = (cp << 6) | (b & 0x3F);
    if (++seen == need) {
      AppendUtf8(cp, &out);
      need = seen = 0;
    }
  }
  if (need) AppendUtf8(0xFFFD, &out);
  return out;
}

const std::vector<int32_t>* BpeCache::Find(std::string_view piece) const {
  auto it = map_.find(piece);
  return it == map_.end() ? nullptr : &it->second;
}

void BpeCache::Insert(std::string_view piece, std::vector<int32_t> ids) {
  if (map_.size() >= capacity_) map_.clear();
  map_.emplace(std::string(piece), std::move(ids));
}

Result<std::shared_ptr<const BpeTokenizer>> BpeTokenizer::Load(const std::string& path) {
  MMFEED_ASSIGN_OR_RETURN(std::string text, ReadMaybeGzip(path));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return Status::Invalid(fmt::format("{}: not a JSON tokenizer file", path));
  // A field of the wrong JSON type makes nlohmann throw; that is a bad file, not a crash.
  try {
    return FromJson(path, j);
  } catch (const nlohmann::json::exception& e) {
    return Status::Invalid(fmt::format("{}: malformed tokenizer file: {}", path, e.what()));
  }
}

Result<std::shared_ptr<const BpeTokenizer>> BpeTokenizer::FromJson(const std::string& path,
                                                                   const nlohmann::json& j) {
  auto unsupported = [&](const std::string& what) {
    return Status::Unsupported(fmt::format("{}: unsupported tokenizer: {}", path, what));
  };
  std::shared_ptr<BpeTokenizer> t(new BpeTokenizer());
  const auto& model = j.value("model", nlohmann::json());
  if (!model.is_object() || model.value("type", "") != "BPE")
    return unsupported(fmt::format("model type '{}' (only BPE)",
                                   model.is_object() ? model.value("type", "?") : "?"));
  if (model.value("byte_fallback", false)) return unsupported("model.byte_fallback");
  if (!model.value("dropout", nlohmann::json()).is_null()) return unsupported("model.dropout");
  if (model.value("continuing_subword_prefix", nlohmann::json("")) != "" ||
      model.value("end_of_word_suffix", nlohmann::json("")) != "")
    return unsupported("model.continuing_subword_prefix / end_of_word_suffix");
  const auto& norm = j.value("normalizer", nlohmann::json());
  if (norm.is_object() && norm.value("type", "") == "NFC")
    t->nfc_ = true;
  else if (!norm.is_null())
    return unsupported(fmt::format("normalizer {}", norm.dump()));
  // Pre-tokenizer: Sequence[Split(regex, Isolated), ByteLevel(use_regex=false)] or
  // ByteLevel(use_regex=true).
  const auto& pre = j.value("pre_tokenizer", nlohmann::json());
  auto byte_level_ok = [](const nlohmann::json& p) {
    return p.is_object() && p.value("type", "") == "ByteLevel" &&
           !p.value("add_prefix_space", false);
  };
  if (byte_level_ok(pre) && pre.value("use_regex", true)) {
    t->pattern_ = Pattern::kGpt2;
  } else if (pre.is_object() && pre.value("type", "") == "Sequence" &&
             pre.value("pretokenizers", nlohmann::json::array()).size() == 2 &&
             byte_level_ok(pre.at("pretokenizers").at(1)) &&
             !pre.at("pretokenizers").at(1).value("use_regex", true)) {
    const auto& split = pre.at("pretokenizers").at(0);
    std::string regex = split.value("pattern", nlohmann::json::object()).value("Regex", "");
    if (split.value("type", "") != "Split" || split.value("behavior", "") != "Isolated" ||
        split.value("invert", false))
      return unsupported(fmt::format("pre_tokenizer {}", split.dump()));
    if (regex != kQwenRegex) return unsupported(fmt::format("pre_tokenizer Split regex {}", regex));
    t->pattern_ = Pattern::kQwen;
  } else {
    return unsupported(fmt::format("pre_tokenizer {}", pre.dump().substr(0, 300)));
  }
  const auto& dec = j.value("decoder", nlohmann::json());
  if (!dec.is_null() && dec.value("type", "") != "ByteLevel")
    return unsupported(fmt::format("decoder {}", dec.dump()));

  // Vocabulary: byte-level strings back to raw bytes.
  std::vector<int> b2c = ByteToCodepoint();
  std::unordered_map<uint32_t, unsigned char> c2b;
  for (int b = 0; b < 256; ++b) c2b[b2c[b]] = static_cast<unsigned char>(b);
  const auto& vocab = model.value("vocab", nlohmann::json::object());
  if (!vocab.is_object() || vocab.empty()) return unsupported("model.vocab is missing");
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
        it.value().get<int64_t>() > (1 << 30))
      return Status::Invalid(fmt::format("{}: vocab entry '{}' has a bad id", path, it.key()));
    int32_t id = it.value().get<int32_t>();
    std::string bytes;
    const std::string& s = it.key();
    for (size_t i = 0; i < s.size();) {
      uint32_t cp = NextCodepoint(s, &i);
      auto b = c2b.find(cp);
      if (b == c2b.end()) return unsupported(fmt::format("vocab entry '{}' is not byte-level", s));
      bytes.push_back(static_cast<char>(b->second));
    }
    if (static_cast<size_t>(id) >= t->id_bytes_.size()) t->id_bytes_.resize(id + 1);
    t->id_bytes_[id] = bytes;
    t->bytes_id_[bytes] = id;
  }
  for (int b = 0; b < 256; ++b) {
    auto it = t->bytes_id_.find(std::string(1, static_cast<char>(b)));
    if (it == t->bytes_id_.end())
      return unsupported(fmt::format("vocab lacks the token for byte {}", b));
    t->byte_id_[b] = it->second;
  }
  const auto& merges = model.value("merges", nlohmann::json::array());
  t->merges_.reserve(merges.size() * 2);
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    std::string left, right;
    const auto& m = merges.at(rank);
    if (m.is_array() && m.size() == 2) {
      left = m.at(0).get<std::string>();
      right = m.at(1).get<std::string>();
    } else if (m.is_string()) {
      std::string s = m.get<std::string>();
      size_t sp = s.find(' ');
      if (sp == std::string::npos)
        return Status::Invalid(fmt::format("{}: merge {} is malformed", path, rank));
      left = s.substr(0, sp);
      right = s.substr(sp + 1);
    } else {
      return Status::Invalid(fmt::format("{}: merge {} is malformed", path, rank));
    }
    auto l = vocab.find(left), r = vocab.find(right), mid = vocab.find(left + right);
    if (l == vocab.end() || r == vocab.end() || mid == vocab.end())
      return Status::Invalid(fmt::format(
          "{}: merge {} ('{}' '{}') uses tokens not in the vocabulary", path, rank, left, right));
    uint64_t key = (static_cast<uint64_t>(l->get<uint32_t>()) << 32) | r->get<uint32_t>();
    t->merges_.emplace(key, (static_cast<uint64_t>(rank) << 32) | mid->get<uint32_t>());
  }
  for (const auto& a : j.value("added_tokens", nlohmann::json::array())) {
    if (a.value("lstrip", false) || a.value("rstrip", false) || a.value("single_word", false) ||
        a.value("normalized", false))
      return unsupported(fmt::format("added token {} (lstrip/rstrip/single_word/normalized)",
                                     a.value("content", "?")));
    Added added{a.value("content", ""), a.value("id", -1)};
    if (added.content.empty() || added.id < 0)
      return Status::Invalid(fmt::format("{}: malformed added token", path));
    if (static_cast<size_t>(added.id) >= t->id_bytes_.size()) t->id_bytes_.resize(added.id + 1);
    t->id_bytes_[added.id] = added.content;
    t->added_.push_back(std::move(added));
  }
  std::sort(t->added_.begin(), t->added_.end(),
            [](const Added& a, const Added& b) { return a.content.size() > b.content.size(); });
  for (const Added& a : t->added_)
    t->added_first_byte_[static_cast<unsigned char>(a.content[0])] = true;
  return std::shared_ptr<const BpeTokenizer>(std::move(t));
}

int32_t BpeTokenizer::TokenId(std::string_view token) const {
  for (const Added& a : added_)
    if (a.content == token) return a.id;
  auto it = bytes_id_.find(std::string(token));
  return it == bytes_id_.end() ? -1 : it->second;
}

void BpeTokenizer::Encode(std::string_view raw, BpeCache* cache, std::vector<int32_t>* ids) const {
  std::string text = ReplaceInvalidUtf8(raw);
  std::string_view s(text);
  // Added tokens split the text first: leftmost match, longest at that position.
  size_t start = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (!added_first_byte_[static_cast<unsigned char>(s[i])]) continue;
    for (const Added& a : added_) {
      if (s.compare(i, a.content.size(), a.content) != 0) continue;
      EncodeSegment(s.substr(start, i - start), cache, ids);
      ids->push_back(a.id);
      i += a.content.size() - 1;
      start = i + 1;
      break;
    }
  }
  EncodeSegment(s.substr(start), cache, ids);
}

void BpeTokenizer::EncodeSegment(std::string_view segment, BpeCache* cache,
                                 std::vector<int32_t>* ids) const {
  if (segment.empty()) return;
  std::string normalized;
  if (nfc_) {
    UErrorCode err = U_ZERO_ERROR;
    const icu::Normalizer2* nfc = icu::Normalizer2::getNFCInstance(err);
    icu::StringPiece piece(segment.data(), static_cast<int32_t>(segment.size()));
    if (U_SUCCESS(err) && !nfc->isNormalizedUTF8(piece, err) && U_SUCCESS(err)) {
      icu::StringByteSink<std::string> sink(&normalized);
      nfc->normalizeUTF8(0, piece, sink, nullptr, err);
      if (U_SUCCESS(err)) segment = normalized;
    }
  }
  std::vector<Cp> cps;
  cps.reserve(segment.size());
  for (size_t i = 0; i < segment.size();) {
    uint32_t off = static_cast<uint32_t>(i);
    uint32_t cp = NextCodepoint(segment, &i);
    cps.push_back({cp, Classify(cp), off});
  }
  for (size_t i = 0; i < cps.size();) {
    size_t end = pattern_ == Pattern::kQwen ? MatchQwen(cps, i) : MatchGpt2(cps, i);
    size_t b0 = cps[i].offset, b1 = end < cps.size() ? cps[end].offset : segment.size();
    EncodePiece(segment.substr(b0, b1 - b0), cache, ids);
    i = end;
  }
}

void BpeTokenizer::EncodePiece(std::string_view piece, BpeCache* cache,
                               std::vector<int32_t>* ids) const {
  if (const std::vector<int32_t>* hit = cache->Find(piece)) {
    ids->insert(ids->end(), hit->begin(), hit->end());
    return;
  }
  std::vector<int32_t> out;
  Merge(piece, &out);
  ids->insert(ids->end(), out.begin(), out.end());
  cache->Insert(piece, std::move(out));
}

// Repeatedly merges the adjacent pair of lowest rank (leftmost on ties), as the reference does.
void BpeTokenizer::Merge(std::string_view piece, std::vector<int32_t>* sym) const {
  sym->resize(piece.size());
  for (size_t i = 0; i < piece.size(); ++i)
    (*sym)[i] = byte_id_[static_cast<unsigned char>(piece[i])];
  while (sym->size() > 1) {
    uint64_t best = UINT64_MAX;
    size_t at = 0;
    for (size_t i = 0; i + 1 < sym->size(); ++i) {
      auto it = merges_.find((static_cast<uint64_t>((*sym)[i]) << 32) |
                             static_cast<uint32_t>((*sym)[i + 1]));
      if (it != merges_.end() && it->second < best) {
        best = it->second;
        at = i;
      }
    }
    if (best == UINT64_MAX) break;
    (*sym)[at] = static_cast<int32_t>(best & 0xFFFFFFFF);
    sym->erase(sym->begin() + at + 1);
  }
}

std::string BpeTokenizer::Decode(const std::vector<int32_t>& ids) const {
  std::string bytes;
  for (int32_t id : ids)
    if (id >= 0 && static_cast<size_t>(id) < id_bytes_.size()) bytes += id_bytes_[id];
  return ReplaceInvalidUtf8(bytes);
}

}  // namespace mmfeed
