// The `qwen_chat` stage: a sample's text and answer wrapped in a chat template and tokenized the
// way Qwen-VL models are fine-tuned: `{image}` becomes, for each of the sample's images in
// order, <|vision_start|>, one <|image_pad|> per merged patch of that image (grid t * h * w /
// merge_size^2, read from the vision stage's grid output, so the count always matches the
// patches), <|vision_end|>; `{video}` likewise with <|video_pad|>, or, with video_seconds
// (Qwen3-VL and Qwen3.5), per temporal patch t: "<t seconds>", <|vision_start|>, h * w /
// merge_size^2 <|video_pad|>, <|vision_end|>. A sample with none (an empty list) gets no vision
// tokens. `labels` holds the ids of the answer and of the template up to and including the
// <|im_end|> that closes it, -100 everywhere else (supervised fine-tuning).
//
// The text between the vision placeholders (template text, the sample's text and answer) is
// tokenized as one string, as tokenizing the whole conversation does (the vision tokens are
// special tokens, which split the text anyway); a token belongs to the answer when it starts
// inside it.
//
// Outputs: <name> int32 [max_len] (padded with pad_token), <name>_lengths int32 [],
// <labels> int32 [max_len] (-100 past the length). With pack: true, <name> and <labels> are
// ragged by the lengths (a batch holds one packed row [1, total tokens]) and <cu_seqlens> int32
// [batch rows + 1] gives where each sample starts, then the total.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "engine/registry.h"
#include "stages/text/bpe_tokenizer.h"

namespace mmfeed {
namespace {

constexpr int32_t kIgnore = -100;  // the label PyTorch's cross-entropy skips

// A template is runs of text separated by vision placeholders; a run is literal text and the
// sample's {text} and {answer}.
struct Piece {
  enum Kind { kLiteral, kText, kAnswer } kind = kLiteral;
  std::string literal;
};
struct Part {
  enum Kind { kRun, kImage, kVideo } kind = kRun;
  std::vector<Piece> run;
};

struct ChatParams {
  std::string name, labels_name, cu_seqlens_name;  // cu_seqlens_name: pack: true
  std::shared_ptr<const BpeTokenizer> bpe;
  std::vector<Part> parts;
  int64_t max_len = 0;
  int32_t pad_id = 0, im_end = -1;
  int32_t vision_start = -1, vision_end = -1, image_pad = -1, video_pad = -1;
  int merge = 2;
  int image_grid = -1;  // index of the image grid in ExtraInputs().tensors
  int video_grid = -1;
  int video_seconds = -1;  // Qwen3-VL's timestamps: "<t seconds>" before each temporal patch
  Stage::Inputs inputs;    // fields: the answer's, when the template has {answer}
};

class ChatWorker : public StageWorker {
 public:
  explicit ChatWorker(const ChatParams& p) : p_(p) {}

  // Tokenizing is the whole work, and what a budget counts.
  Status Measure(const SampleContext& ctx, const FieldValue& in, const OutputRow& out) override {
    return Process(ctx, in, out);
  }

  Status Process(const SampleContext& ctx, const FieldValue& in, const OutputRow& out) override {
    ids_.clear();
    labels_.clear();
    bool answered = false;  // past the answer: labelled up to and including the next <|im_end|>
    for (size_t i = 0; i < p_.parts.size(); ++i) {
      const Part& part = p_.parts[i];
      if (part.kind == Part::kRun) {
        // The first timestamp is text after this run's, with no special token between.
        const bool timed = i + 1 < p_.parts.size() && p_.parts[i + 1].kind == Part::kVideo &&
                           p_.video_seconds >= 0;
        std::string stamp;
        if (timed && !NoVision(ctx, p_.video_grid))
          MMFEED_RETURN_IF_ERROR(Timestamp(ctx, 0, 0, &stamp));
        MMFEED_RETURN_IF_ERROR(Run(part.run, ctx, in, &answered, stamp));
        continue;
      }
      const bool image = part.kind == Part::kImage;
      const int input = image ? p_.image_grid : p_.video_grid;
      const TensorSpec& spec = *ctx.tensor_specs[input];
      if (spec.dtype != DType::kInt32 || spec.shape.empty() || spec.shape.back() != 3)
        return Status::Invalid(
            fmt::format("'{}' is not a grid output (int32 [images, 3])", spec.name));
      const size_t grids = spec.NumBytes() / (3 * sizeof(int32_t));
      for (size_t g = 0; g < grids; ++g) {  // every image of the sample, in order
        int32_t grid[3];
        std::memcpy(grid, ctx.tensors[input] + g * sizeof grid, sizeof grid);
        // Past the last image (none at all: the sample's list is empty).
        if (grid[0] == 0 && grid[1] == 0 && grid[2] == 0) break;
        const int64_t patches = int64_t{grid[0]} * grid[1] * grid[2];
        if (grid[0] < 1 || grid[1] < 1 || grid[2] < 1 || patches % (p_.merge * p_.merge))
          return Status::Invalid(fmt::format("{} grid [{}, {}, {}] is not whole merge windows",
                                             image ? "image" : "video", grid[0], grid[1], grid[2]));
        const int64_t pads = patches / (p_.merge * p_.merge);
        if (pads > p_.max_len) return TooLong(pads);
        if (image || p_.video_seconds < 0) {
          Block(pads, image ? p_.image_pad : p_.video_pad, answered);
          continue;
        }
        // Qwen3-VL: each temporal patch is "<t seconds>" then its own block (the first
        // video's first time went with the text before it).
        if ((int64_t{grid[1]} * grid[2]) % (p_.merge * p_.merge))
          return Status::Invalid(
              fmt::format("video grid [{}, {}, {}]: a temporal patch is not "
                          "whole merge windows",
                          grid[0], grid[1], grid[2]));
        for (int32_t t = 0; t < grid[0]; ++t) {
          if (t > 0 || g > 0) {
            std::string stamp;
            MMFEED_RETURN_IF_ERROR(Timestamp(ctx, g, t, &stamp));
            MMFEED_RETURN_IF_ERROR(Run({}, ctx, in, &answered, stamp));
          }
          Block(pads / grid[0], p_.video_pad, answered);
        }
        if (static_cast<int64_t>(ids_.size()) > p_.max_len) return TooLong(ids_.size());
      }
    }
    if (static_cast<int64_t>(ids_.size()) > p_.max_len) return TooLong(ids_.size());
    int32_t* ids = out.As<int32_t>(0);
    int32_t* labels = out.As<int32_t>(2);
    std::copy(ids_.begin(), ids_.end(), ids);
    std::fill(ids + ids_.size(), ids + p_.max_len, p_.pad_id);
    std::copy(labels_.begin(), labels_.end(), labels);
    std::fill(labels + labels_.size(), labels + p_.max_len, kIgnore);
    *out.As<int32_t>(1) = static_cast<int32_t>(ids_.size());
    return Status::Ok();
  }

 private:
  // <|vision_start|>, `pads` times `pad`, <|vision_end|>; labels only inside the answer.
  void Block(int64_t pads, int32_t pad, bool answered) {
    ids_.push_back(p_.vision_start);
    ids_.insert(ids_.end(), pads, pad);
    ids_.push_back(p_.vision_end);
    labels_.insert(labels_.end(), pads + 2, kIgnore);
    if (answered)  // an answer that holds the image: its tokens are labels too
      std::copy(ids_.end() - (pads + 2), ids_.end(), labels_.end() - (pads + 2));
  }

  // True when the sample has no image or no video (a first grid row of zeros).
  static bool NoVision(const SampleContext& ctx, int input) {
    int32_t grid[3];
    std::memcpy(grid, ctx.tensors[input], sizeof grid);
    return grid[0] == 0 && grid[1] == 0 && grid[2] == 0;
  }

  // "<1.5 seconds>": video v's temporal patch t's time, as Qwen3-VL's processor writes it.
  Status Timestamp(const SampleContext& ctx, size_t v, int32_t t, std::string* out) const {
    const TensorSpec& spec = *ctx.tensor_specs[p_.video_seconds];
    const size_t per_video = spec.shape.empty() ? 1 : static_cast<size_t>(spec.shape.back());
    const size_t at = v * per_video + static_cast<size_t>(t);
    if (spec.dtype != DType::kFloat32 || static_cast<size_t>(t) >= per_video ||
        at >= spec.NumBytes() / sizeof(float))
      return Status::Invalid(
          fmt::format("'{}' is not the float32 times of the videos' temporal patches ([videos, "
                      "patches])",
                      spec.name));
    float seconds;
    std::memcpy(&seconds, ctx.tensors[p_.video_seconds] + at * sizeof seconds, sizeof seconds);
    *out = fmt::format("<{:.1f} seconds>", seconds);
    return Status::Ok();
  }

  // Tokenizes one run and then `suffix` (template text) as a single string, and labels the
  // tokens that start in the answer, and those after it up to and including the next <|im_end|>.
  Status Run(const std::vector<Piece>& run, const SampleContext& ctx, const FieldValue& in,
             bool* answered, const std::string& suffix) {
    text_.clear();
    size_t answer_begin = std::string::npos, answer_end = std::string::npos;
    for (const Piece& piece : run) {
      if (piece.kind == Piece::kLiteral) {
        text_ += piece.literal;
        continue;
      }
      const bool answer = piece.kind == Piece::kAnswer;
      MMFEED_ASSIGN_OR_RETURN(std::string_view t, FieldBytes(answer ? *ctx.fields[0] : in, &file_));
      if (answer) answer_begin = text_.size();
      text_.append(t.data(), t.size());
      if (answer) answer_end = text_.size();
    }
    text_ += suffix;
    const size_t at = ids_.size();
    p_.bpe->Encode(text_, &cache_, &ids_);
    size_t offset = 0;
    bool begun = false;
    for (size_t i = at; i < ids_.size(); ++i) {
      const int32_t id = ids_[i];
      // The template has no vision tokens outside its placeholders: these came from the
      // sample, and would break the pad count the model checks.
      if (id == p_.image_pad || id == p_.video_pad || id == p_.vision_start || id == p_.vision_end)
        return Status::Corrupt(
            fmt::format("the sample's text contains the vision token {}", p_.bpe->Decode({id})));
      if (!begun && offset >= answer_begin) *answered = begun = true;  // npos: no answer here
      labels_.push_back(*answered ? id : kIgnore);
      if (*answered && offset >= answer_end && id == p_.im_end) *answered = false;
      offset += p_.bpe->TokenBytes(id);
    }
    return Status::Ok();
  }

  Status TooLong(size_t n) const {
    return Status::TooLarge(
        fmt::format("{} tokens with the image pads, above max_len {}", n, p_.max_len));
  }

  const ChatParams& p_;
  std::string file_, text_;
  std::vector<int32_t> ids_, labels_;
  BpeCache cache_;
};

class ChatStage : public Stage {
 public:
  explicit ChatStage(ChatParams p) : p_(std::move(p)) {}
  std::vector<TensorSpec> OutputSpecs() const override {
    const std::string lengths = p_.name + "_lengths";
    const std::string packed = p_.cu_seqlens_name.empty() ? "" : lengths;
    std::vector<TensorSpec> specs = {{p_.name, DType::kInt32, {p_.max_len}, packed},
                                     {lengths, DType::kInt32, {}},
                                     {p_.labels_name, DType::kInt32, {p_.max_len}, packed}};
    if (!packed.empty()) specs.push_back({p_.cu_seqlens_name, DType::kInt32, {2}, "", p_.name});
    return specs;
  }
  std::unique_ptr<StageWorker> NewWorker() const override {
    return std::make_unique<ChatWorker>(p_);
  }
  CostOutputs Costs() const override { return {p_.name + "_lengths", ""}; }
  Inputs ExtraInputs() const override { return p_.inputs; }
  WhyNot WhyNotCacheable() const override { return std::nullopt; }

 private:
  ChatParams p_;
};

Result<int32_t> SpecialId(const BpeTokenizer& bpe, const std::string& token) {
  int32_t id = bpe.TokenId(token);
  if (id < 0) return Status::Invalid(fmt::format("the tokenizer has no token {}", token));
  return id;
}

Result<std::unique_ptr<Stage>> MakeChatStage(const StageArgs& a) {
  const Params& prm = a.params;
  ChatParams p;
  p.name = a.name;
  p.labels_name = prm.GetString("labels");
  if (p.labels_name.empty() || p.labels_name == p.name || p.labels_name == p.name + "_lengths")
    return Status::Invalid("labels must name an output other than the stage's own");
  if (prm.GetBool("pack")) {
    p.cu_seqlens_name = prm.GetString("cu_seqlens");
    if (p.cu_seqlens_name.empty() || p.cu_seqlens_name == p.name ||
        p.cu_seqlens_name == p.name + "_lengths" || p.cu_seqlens_name == p.labels_name)
      return Status::Invalid("cu_seqlens must name an output other than the stage's others");
  }
  Result<std::shared_ptr<const BpeTokenizer>> bpe =
      BpeTokenizer::Load(ResolvePath(a.base_dir, prm.GetString("tokenizer")));
  if (!bpe.ok()) return bpe.status();
  p.bpe = *bpe;
  const BpeTokenizer& t = *p.bpe;
  p.max_len = prm.GetInt("max_len");
  if (p.max_len < 1 || p.max_len > (1 << 24))
    return Status::Invalid("max_len must be in 1..16777216");
  p.merge = static_cast<int>(prm.GetInt("merge_size"));
  if (p.merge < 1 || p.merge > 8) return Status::Invalid("merge_size must be in 1..8");
  Result<int32_t> pad = SpecialId(t, prm.GetString("pad_token"));
  Result<int32_t> end = SpecialId(t, "<|im_end|>");
  Result<int32_t> vs = SpecialId(t, "<|vision_start|>");
  Result<int32_t> ve = SpecialId(t, "<|vision_end|>");
  Result<int32_t> ip = SpecialId(t, "<|image_pad|>");
  Result<int32_t> vp = SpecialId(t, "<|video_pad|>");
  for (const auto* r : {&pad, &end, &vs, &ve, &ip, &vp})
    if (!r->ok()) return r->status();
  p.pad_id = *pad;
  p.im_end = *end;
  p.vision_start = *vs;
  p.vision_end = *ve;
  p.image_pad = *ip;
  p.video_pad = *vp;

  // The template: runs of text between the vision placeholders.
  const std::string& tmpl = prm.GetString("template");
  static const std::pair<const char*, int> kPlaceholders[] = {
      {"{text}", 0}, {"{answer}", 1}, {"{image}", 2}, {"{video}", 3}};
  int count[4] = {};
  p.parts.push_back({});
  size_t literal = 0;
  auto add_literal = [&](size_t end) {
    if (end > literal)
      p.parts.back().run.push_back({Piece::kLiteral, tmpl.substr(literal, end - literal)});
  };
  for (size_t i = 0; i < tmpl.size(); ++i) {
    for (const auto& [text, k] : kPlaceholders) {
      const size_t len = std::strlen(text);
      if (tmpl.compare(i, len, text) != 0) continue;
      add_literal(i);
      ++count[k];
      if (k < 2) {
        p.parts.back().run.push_back({k == 0 ? Piece::kText : Piece::kAnswer, ""});
      } else {
        p.parts.push_back({k == 2 ? Part::kImage : Part::kVideo, {}});
        p.parts.push_back({});
      }
      literal = i + len;
      i += len - 1;
      break;
    }
  }
  add_literal(tmpl.size());
  for (const char* token : {"<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>"})
    if (tmpl.find(token) != std::string::npos)
      return Status::Invalid(fmt::format(
          "template holds {}: write {{image}} or {{video}}, which expand to the right count",
          token));
  if (count[0] != 1) return Status::Invalid("template must hold {text} once");
  if (count[1] > 1 || count[2] > 1 || count[3] > 1)
    return Status::Invalid(
        "template holds {answer}, {image} and {video} at most once each ({image} expands to "
        "every image of the sample, in order)");
  const std::string& answer_field = prm.GetString("answer_field");
  if (count[1]) {
    if (answer_field.empty())
      return Status::Invalid("template has {answer}: answer_field is empty");
    p.inputs.fields.push_back(answer_field);
  }
  auto grid = [&](int k, const char* key, const char* placeholder, int* index) {
    const std::string& tensor = prm.GetString(key);
    if (count[k] && tensor.empty())
      return Status::Invalid(
          fmt::format("template has {}: {} must name the grid output of the "
                      "vision stage",
                      placeholder, key));
    if (!count[k] && !tensor.empty())
      return Status::Invalid(
          fmt::format("{} is set but the template has no {} (set it to \"\")", key, placeholder));
    if (count[k]) {
      *index = static_cast<int>(p.inputs.tensors.size());
      p.inputs.tensors.push_back(tensor);
    }
    return Status::Ok();
  };
  MMFEED_RETURN_IF_ERROR(grid(2, "image_grid", "{image}", &p.image_grid));
  MMFEED_RETURN_IF_ERROR(grid(3, "video_grid", "{video}", &p.video_grid));
  const std::string& seconds = prm.GetString("video_seconds");
  if (!seconds.empty()) {
    if (!count[3]) return Status::Invalid("video_seconds is set but the template has no {video}");
    p.video_seconds = static_cast<int>(p.inputs.tensors.size());
    p.inputs.tensors.push_back(seconds);
  }
  return std::unique_ptr<Stage>(new ChatStage(std::move(p)));
}

MMFEED_REGISTER_STAGE((StageSchema{
    "qwen_chat",
    "wrap the sample's text (and answer) in a chat template and tokenize it (byte-level BPE "
    "tokenizer.json): {image}/{video} become <|vision_start|>, one <|image_pad|>/<|video_pad|> "
    "per merged patch of the sample's grid (read from the vision stage), <|vision_end|>. "
    "Outputs: <name> int32 [max_len], <name>_lengths int32 [], <labels> int32 [max_len] (the "
    "answer's ids through its <|im_end|>, -100 elsewhere); pack: true: <name> and <labels> "
    "[1, total tokens] per batch, <cu_seqlens> int32 [rows + 1]",
    StageKind::kField,
    /*field_is_path=*/false,
    {
        {"tokenizer", ParamType::kString, std::nullopt, "a Qwen tokenizer.json / .json.gz path"},
        {"template", ParamType::kString,
         std::string("<|im_start|>user\n{image}{text}<|im_end|>\n<|im_start|>assistant\n{answer}"
                     "<|im_end|>\n"),
         "the conversation: {text} (the field) once; {answer} (answer_field), {image} and {video} "
         "at most once each; special tokens recognised"},
        {"answer_field", ParamType::kString, std::string("answer"),
         "the sample's field that fills {answer}"},
        {"image_grid", ParamType::kString, std::string("image_grid_thw"),
         "the grid output ([t, h, w]) of the image's qwen_vision stage; \"\" without {image}"},
        {"video_grid", ParamType::kString, std::string(""),
         "the grid output of the video's vision stage; \"\" without {video}"},
        {"video_seconds", ParamType::kString, std::string(""),
         "Qwen3-VL / Qwen3.5 video text: the qwen_video stage's <grid>_seconds; {video} becomes, "
         "per temporal patch, \"<t seconds>\" then its own <|vision_start|> pads "
         "<|vision_end|>. \"\": one block of t * h * w / merge_size^2 pads (Qwen2-VL)"},
        Ranged({"merge_size", ParamType::kInt, int64_t{2},
                "the vision stage's merge_size: one pad token per merge_size^2 patches"},
               1, 8),
        Ranged(
            {"max_len", ParamType::kInt, int64_t{2048},
             "tokens per sample; a longer sample is refused (cutting would break the pad count)"},
            1, 16777216),
        {"pad_token", ParamType::kString, std::string("<|endoftext|>"),
         "the token written past a sample's end"},
        {"labels", ParamType::kString, std::string("labels"), "name of the labels output"},
        {"pack", ParamType::kBool, false,
         "a batch's samples as one packed row: <name> and <labels> [1, total tokens], with "
         "<cu_seqlens> [rows + 1] (varlen attention) and <name>_lengths"},
        {"cu_seqlens", ParamType::kString, std::string("cu_seqlens"),
         "pack: true: name of the sequence starts output"},
    },
    MakeChatStage}));

}  // namespace
}  // namespace mmfeed
