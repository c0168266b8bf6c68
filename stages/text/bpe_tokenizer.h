// BpeTokenizer: byte-level BPE that loads a Hugging Face tokenizer.json (Qwen2/Qwen3 and GPT-2
// style) and produces the same ids as Hugging Face `tokenizers`.
//
// Encoding follows the reference step by step: invalid UTF-8 becomes U+FFFD (as a WHATWG
// decoder does); added tokens are matched first (leftmost, longest); the text between them is
// NFC-normalized (if the file says so), split by the pre-tokenizer's regex (a hand-written
// matcher for the two supported patterns, Unicode classes from ICU), and each piece is turned
// into bytes and merged by rank. Pieces seen recently are cached.
//
// A BpeTokenizer is immutable after Load and may be shared by threads; each thread encodes
// with its own BpeCache.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/status.h"

namespace mmfeed {

// Recently seen pre-token pieces and their ids. Bounded: when full it starts over.
class BpeCache {
 public:
  explicit BpeCache(size_t capacity = 1 << 16) : capacity_(capacity) {}
  const std::vector<int32_t>* Find(std::string_view piece) const;
  void Insert(std::string_view piece, std::vector<int32_t> ids);

 private:
  // Looked up by string_view, so a cache hit allocates nothing.
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>()(s); }
  };
  size_t capacity_;
  std::unordered_map<std::string, std::vector<int32_t>, Hash, std::equal_to<>> map_;
};

class BpeTokenizer {
 public:
  // Loads tokenizer.json, or tokenizer.json.gz. Errors name the file and the unsupported part.
  static Result<std::shared_ptr<const BpeTokenizer>> Load(const std::string& path);

  // Appends the ids of `text` (UTF-8, invalid sequences replaced) to *ids.
  void Encode(std::string_view text, BpeCache* cache, std::vector<int32_t>* ids) const;
  // The text of `ids` (bytes that are not valid UTF-8 become U+FFFD).
  std::string Decode(const std::vector<int32_t>& ids) const;
  // Id of an added/special token or vocabulary entry given as text; -1 if none.
  int32_t TokenId(std::string_view token) const;
  // How many bytes of text token `id` stands for (an added token: its content's).
  // REQUIRES: 0 <= id < vocab_size().
  size_t TokenBytes(int32_t id) const { return id_bytes_[id].size(); }
  size_t vocab_size() const { return id_bytes_.size(); }

 private:
  static Result<std::shared_ptr<const BpeTokenizer>> FromJson(const std::string& path,
                                                              const nlohmann::json& j);
  struct Added {
    std::string content;
    int32_t id;
  };
  enum class Pattern { kQwen, kGpt2 };

  BpeTokenizer() = default;
  void EncodeSegment(std::string_view text, BpeCache* cache, std::vector<int32_t>* ids) const;
  void EncodePiece(std::string_view piece, BpeCache* cache, std::vector<int32_t>* ids) const;
  void Merge(std::string_view piece, std::vector<int32_t>* out) const;

  Pattern pattern_ = Pattern::kQwen;
  bool nfc_ = false;
  std::vector<std::string> id_bytes_;  // id -> raw bytes (added tokens: their content)
  std::unordered_map<std::string, int32_t> bytes_id_;
  int32_t byte_id_[256];
  std::unordered_map<uint64_t, uint64_t> merges_;  // (left << 32 | right) -> (rank << 32 | merged)
  std::vector<Added> added_;                       // longest first
  bool added_first_byte_[256] = {};                // some added token starts with this byte
};

// Replaces invalid UTF-8 with U+FFFD the way a WHATWG decoder (Node, browsers) does: one
// U+FFFD per maximal ill-formed subsequence.
std::string ReplaceInvalidUtf8(std::string_view s);

}  // namespace mmfeed
