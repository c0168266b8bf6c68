// The `video` stage: sample T frames per video with FFmpeg (see video_sampler.h for which
// frames and how), resized with swscale to `size`, as uint8 or normalized float32/bfloat16.
// Outputs: <name> [T,3,H,W] (TCHW), [T,H,W,3] (THWC) or [3,T,H,W] (CTHW); <name>_pts float32 [T],
// seconds from the video's start; <name>_mask uint8 [T], 0 where the video ended before the target
// (padding). The audio track of a video goes to an `audio` stage reading the same field.
#include <fmt/format.h>

#include <cstdlib>

extern "C" {
#include <libswscale/swscale.h>
}

#include "engine/registry.h"
#include "stages/ffmpeg/av_input.h"
#include "stages/video/video_sampler.h"

namespace mmfeed {

Result<VideoOptions> VideoOptionsFromParams(const Params& prm) {
  VideoOptions o;
  const std::string& sampling = prm.GetString("sampling");
  o.sampling = sampling == "clip"         ? VideoSampling::kClip
               : sampling == "keyframes"  ? VideoSampling::kKeyframes
               : sampling == "timestamps" ? VideoSampling::kTimestamps
                                          : VideoSampling::kUniform;
  o.frames = static_cast<int>(prm.GetInt("frames"));
  o.timestamps = prm.GetFloatList("timestamps");
  if (o.sampling == VideoSampling::kTimestamps) {
    if (o.timestamps.empty())
      return Status::Invalid("sampling: timestamps needs a non-empty `timestamps` list (seconds)");
    o.frames = static_cast<int>(o.timestamps.size());
  } else if (!o.timestamps.empty()) {
    return Status::Invalid("`timestamps` is only used with sampling: timestamps");
  }
  if (o.frames < 1 || o.frames > 4096) return Status::Invalid("frames must be in 1..4096");
  o.fps = prm.GetFloat("fps");
  if (!(o.fps > 0) || o.fps > 1000) return Status::Invalid("fps must be in (0, 1000]");
  const std::string& start = prm.GetString("clip_start");
  if (start == "random") {
    o.clip_start = -1;
  } else {
    char* end = nullptr;
    o.clip_start = std::strtod(start.c_str(), &end);
    if (start.empty() || *end != '\0' || !(o.clip_start >= 0))
      return Status::Invalid(
          fmt::format("clip_start must be 'random' or seconds >= 0, got '{}'", start));
  }
  const auto& size = prm.GetIntList("size");
  o.out_h = static_cast<int>(size[0]);
  o.out_w = static_cast<int>(size[1]);
  if (o.out_h < 1 || o.out_w < 1 || o.out_h > 8192 || o.out_w > 8192)
    return Status::Invalid("size must be [height, width] with each in 1..8192");
  const std::string& layout = prm.GetString("layout");
  o.layout = layout == "THWC"   ? VideoLayout::kTHWC
             : layout == "CTHW" ? VideoLayout::kCTHW
                                : VideoLayout::kTCHW;
  o.resize = prm.GetString("resize") == "cover" ? VideoResize::kCover : VideoResize::kStretch;
  ParseDType(prm.GetString("dtype"), &o.pixels.dtype);
  const auto& mean = prm.GetFloatList("mean");
  const auto& stdv = prm.GetFloatList("std");
  for (int c = 0; c < 3; ++c) {
    if (stdv[c] <= 0) return Status::Invalid("std values must be positive");
    o.pixels.mul[c] = static_cast<float>(1.0 / (255.0 * stdv[c]));
    o.pixels.add[c] = static_cast<float>(-mean[c] / stdv[c]);
  }
  o.pad = prm.GetString("pad") == "zeros" ? VideoPad::kZeros : VideoPad::kRepeatLast;
  const std::string& interp = prm.GetString("interpolation");
  o.sws_flags = interp == "area"      ? SWS_AREA
                : interp == "bicubic" ? SWS_BICUBIC
                : interp == "nearest" ? SWS_POINT
                                      : SWS_BILINEAR;
  o.scale_in = prm.GetString("scale_in") == "yuv" ? VideoScaleIn::kYuv : VideoScaleIn::kRgb24;
  o.threads = static_cast<int>(prm.GetInt("threads"));
  if (o.threads < 0 || o.threads > 64)
    return Status::Invalid("threads must be in 0..64 (0: FFmpeg picks)");
  o.max_pixels = prm.GetInt("max_pixels");
  if (o.max_pixels < 1) return Status::Invalid("max_pixels must be positive");
  const int64_t cache = prm.GetInt("index_cache");
  if (cache < 0) return Status::Invalid("index_cache must be >= 0");
  o.index_cache = static_cast<size_t>(cache);
  return o;
}

namespace {

class VideoWorker : public StageWorker {
 public:
  VideoWorker(const std::string& name, const VideoOptions& o, KeyframeIndexCache* cache,
              VideoStatsSum* shared)
      : name_(name), sampler_(o, cache), shared_(shared) {}

  Status Process(const SampleContext& ctx, const FieldValue& in, const OutputRow& out) override {
    Rng rng(ctx.seed, ctx.epoch, ctx.id, name_);
    Status s = sampler_.Sample(in, &rng, out[0], out.As<float>(1), out[2]);
    shared_->Add(sampler_.stats(), &seen_);
    return s;
  }

 private:
  const std::string& name_;
  VideoSampler sampler_;
  VideoStatsSum* shared_;
  VideoStats seen_;  // what was already added to shared_
};

class VideoStage : public Stage {
 public:
  VideoStage(std::string name, VideoOptions o)
      : name_(std::move(name)), o_(std::move(o)), cache_(o_.index_cache) {}
  std::vector<TensorSpec> OutputSpecs() const override { return VideoOutputSpecs(name_, o_); }
  std::unique_ptr<StageWorker> NewWorker() const override {
    return std::make_unique<VideoWorker>(name_, o_, &cache_, &shared_);
  }
  std::vector<std::pair<std::string, double>> Metrics() const override { return shared_.Metrics(); }
  WhyNot WhyNotCacheable() const override {
    if (o_.sampling == VideoSampling::kClip && o_.clip_start < 0)
      return "clip_start: random draws a new clip every epoch (the decoded video it is cut from "
             "is many times the clip: a fixed clip_start, or uniform, timestamps or keyframes "
             "sampling, is cacheable)";
    return std::nullopt;
  }

 private:
  std::string name_;
  VideoOptions o_;
  // Shared by the workers, internally synchronized; mutable because workers are made by a
  // const stage.
  mutable KeyframeIndexCache cache_;
  mutable VideoStatsSum shared_;
};

Result<std::unique_ptr<Stage>> MakeVideoStage(const StageArgs& a) {
  RouteFfmpegLogs();
  MMFEED_ASSIGN_OR_RETURN(VideoOptions o, VideoOptionsFromParams(a.params));
  return std::unique_ptr<Stage>(new VideoStage(a.name, std::move(o)));
}

MMFEED_REGISTER_STAGE((StageSchema{
    "video",
    "sample T frames per video with FFmpeg (seeking to keyframes, skipping what is not needed), "
    "resize with "
    "swscale. Outputs: <name> [T,3,H,W] or [T,H,W,3], <name>_pts float32 [T] seconds, <name>_mask "
    "uint8 [T]",
    StageKind::kField,
    /*field_is_path=*/true,
    {
        {"sampling",
         ParamType::kString,
         std::string("uniform"),
         "uniform (T frames over the whole video) | clip (T frames at fps from clip_start) | "
         "keyframes | timestamps",
         {"uniform", "clip", "keyframes", "timestamps"}},
        Ranged({"frames", ParamType::kInt, int64_t{16},
                "T: frames per video (timestamps: the list's length)"},
               1, 4096),
        Ranged({"fps", ParamType::kFloat, 4.0, "clip: frames per second of the clip"}, std::nullopt,
               1000),
        {"clip_start", ParamType::kString, std::string("random"),
         "clip: 'random' (seeded per sample and epoch) or seconds from the start, e.g. '2.5'"},
        {"timestamps", ParamType::kFloatList, std::vector<double>{},
         "timestamps: seconds from the start"},
        Ranged({"size", ParamType::kIntList, std::nullopt, "output [height, width]", {}, 2}, 1,
               8192),
        {"layout",
         ParamType::kString,
         std::string("TCHW"),
         "TCHW | THWC | CTHW (channels first over time)",
         {"TCHW", "THWC", "CTHW"}},
        {"resize",
         ParamType::kString,
         std::string("stretch"),
         "stretch: the whole frame to size | cover: keep the aspect ratio, cover size, center crop",
         {"stretch", "cover"}},
        PixelDTypeParam(),
        PixelMeanParam(),
        PixelStdParam(),
        {"pad",
         ParamType::kString,
         std::string("repeat_last"),
         "frames past the end of a short video: repeat_last | zeros (mask is 0 either way)",
         {"repeat_last", "zeros"}},
        {"interpolation",
         ParamType::kString,
         std::string("bilinear"),
         "swscale resize filter",
         {"bilinear", "bicubic", "area", "nearest"}},
        {"scale_in",
         ParamType::kString,
         std::string("rgb24"),
         "rgb24: resize and convert to RGB24 in one swscale call (PyAV's reformat bytes) | yuv: "
         "resize the decoder's YUV planes, then convert at the output size (about 3x cheaper; "
         "chroma differs slightly at colour edges, docs/design/video.md)",
         {"rgb24", "yuv"}},
        {"threads", ParamType::kInt, int64_t{1},
         "decoder threads per worker (workers are the main parallelism)"},
        Ranged({"max_pixels", ParamType::kInt, int64_t{7680} * 4320,
                "refuse videos with larger frames, before allocating"},
               1, std::nullopt),
        Ranged({"index_cache", ParamType::kInt, int64_t{4096},
                "files whose keyframe index is kept (LRU)"},
               0, std::nullopt),
    },
    MakeVideoStage}));

}  // namespace
}  // namespace mmfeed
