// The `qwen_video` stage: a video as the Qwen3-VL / Qwen3.5 vision encoders take it, computed as
// Hugging Face's Qwen3VLVideoProcessor does: int(total frames / source fps * fps) frames,
// clamped to [min_frames, max_frames] and to the video's frame count, at the indices
// linspace(0, total - 1, n) rounds to; resized with PIL's antialiased bicubic to the size the
// video smart_resize gives for n frames (sides multiples of patch_size * merge_size, n * h * w
// within [min_pixels, max_pixels]); rescaled, normalized; the last frame repeated up to a
// multiple of temporal_patch_size; cut into patches in the reference's order, temporal patch by
// temporal patch.
//
// The frames come from the seek-based sampler (video_sampler.h): the reference's frame k (its
// k-th decoded frame) is taken as the frame on screen at (k + 0.5) / source fps, which is frame k
// of a constant-frame-rate video. Frame count and rate are the stream's (nb_frames and
// avg_frame_rate, as PyAV reports them; a stream without a count: duration * rate).
//
// The field is one video, or a list of up to max_videos. Outputs, ragged like qwen_vision's:
// <name> float32 or bfloat16 [patches, 3 * temporal_patch_size * patch_size^2] (every video's
// patches in order), <grid> int32 [videos, 3] (t, h, w in patches), <grid>_count int32 [] (the
// sample's videos), and <grid>_seconds float32 [max_videos, ceil(max_frames /
// temporal_patch_size)]: each temporal patch's time, the mean of its first and last frame's
// index / source fps, to a tenth of a second as Qwen3-VL's chat text writes it ("<1.5
// seconds>"; qwen_chat's video_seconds), 0 past t.
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>

#include "engine/registry.h"
#include "stages/common/qwen_patches.h"
#include "stages/common/resample.h"
#include "stages/ffmpeg/av_input.h"
#include "stages/video/video_sampler.h"

namespace mmfeed {
namespace {

struct QwenVideoParams {
  QwenStageParams q;
  double fps = 2;
  int64_t min_frames = 4, max_frames = 768;
  int64_t max_groups = 0;  // temporal patches per video: ceil(max_frames / temporal_patch_size)
  VideoOptions video;      // the sampler's: source size limit, decoder threads, index cache
};

// A time as Python's f"{t:.1f}" writes it, back as a number.
float Tenths(double seconds) {
  return static_cast<float>(std::strtod(fmt::format("{:.1f}", seconds).c_str(), nullptr));
}

class QwenVideoWorker : public StageWorker {
 public:
  QwenVideoWorker(const QwenVideoParams& p, KeyframeIndexCache* cache, VideoStatsSum* shared)
      : p_(p), sampler_(p.video, cache), shared_(shared) {}

  Status Process(const SampleContext&, const FieldValue& in, const OutputRow& out) override {
    return EachVideo(in, out,
                     [&](const FieldValue& one, uint8_t* rows, int32_t* grid, float* seconds) {
                       return Video(one, rows, grid, seconds);
                     });
  }

  Status Measure(const SampleContext&, const FieldValue& in, const OutputRow& out) override {
    return EachVideo(in, out,
                     [&](const FieldValue& one, uint8_t*, int32_t* grid, float* seconds) -> Status {
                       Result<VideoFacts> facts = sampler_.Probe(one);
                       shared_->Add(sampler_.stats(), &seen_);  // its keyframe index is built here
                       if (!facts.ok()) return facts.status();
                       MMFEED_ASSIGN_OR_RETURN(Pick pick, Choose(*facts));
                       Describe(pick, grid, seconds);
                       return Status::Ok();
                     });
  }

 private:
  using VideoFn = std::function<Status(const FieldValue&, uint8_t*, int32_t*, float*)>;
  Status EachVideo(const FieldValue& in, const OutputRow& out, const VideoFn& one) {
    float* seconds = out.As<float>(3);
    std::fill(seconds, seconds + p_.q.max_items * p_.max_groups, 0.0f);
    return QwenEachItem(p_.q, "video", in, out,
                        [&](const FieldValue& v, size_t i, uint8_t* rows, int32_t* grid) {
                          return one(v, rows, grid, seconds + i * p_.max_groups);
                        });
  }

  // What the reference takes of a video: the frames' indices and the resized size.
  struct Pick {
    std::vector<int64_t> indices;
    double source_fps = 0;
    int oh = 0, ow = 0;
    int64_t groups = 0;  // temporal patches
  };
  Result<Pick> Choose(const VideoFacts& f) const {
    const QwenPatching& q = p_.q.patching;
    const int tps = q.temporal_patch_size;
    Pick pick;
    pick.source_fps = f.fps > 0 ? f.fps : 24;  // the reference's default for an unknown rate
    if (f.frames < 1) return Status::Corrupt("the video stream declares no frame count");
    pick.indices =
        QwenVideoFrameIndices(f.frames, pick.source_fps, p_.fps, p_.min_frames, p_.max_frames);
    MMFEED_ASSIGN_OR_RETURN(
        QwenSize size,
        QwenVideoSmartResize(static_cast<int64_t>(pick.indices.size()), f.height, f.width, tps,
                             q.patch_size * q.merge_size, p_.q.min_pixels, p_.q.max_pixels));
    pick.oh = static_cast<int>(size.height);
    pick.ow = static_cast<int>(size.width);
    pick.groups = (static_cast<int64_t>(pick.indices.size()) + tps - 1) / tps;
    const int64_t patches = pick.groups * (pick.oh / q.patch_size) * (pick.ow / q.patch_size);
    if (patches > p_.q.max_patches)
      return Status::TooLarge(fmt::format(
          "video is {}x{}, {} frames sampled: resized to {}x{} it has {} patches, "
          "above the {} max_pixels allows",
          f.width, f.height, pick.indices.size(), pick.ow, pick.oh, patches, p_.q.max_patches));
    return pick;
  }

  // The grid, and each temporal patch's time: the mean of its first and last frame's.
  void Describe(const Pick& pick, int32_t* grid, float* seconds) const {
    const QwenPatching& q = p_.q.patching;
    const int64_t tps = q.temporal_patch_size, n = static_cast<int64_t>(pick.indices.size());
    for (int64_t g = 0; g < pick.groups; ++g) {
      const int64_t first = pick.indices[g * tps],
                    end = pick.indices[std::min(g * tps + tps, n) - 1];
      seconds[g] = Tenths((first / pick.source_fps + end / pick.source_fps) / 2);
    }
    grid[0] = static_cast<int32_t>(pick.groups);
    grid[1] = pick.oh / q.patch_size;
    grid[2] = pick.ow / q.patch_size;
  }

  // One video's patches at `rows`, its grid and its temporal patches' times.
  Status Video(const FieldValue& in, uint8_t* rows, int32_t* grid, float* seconds) {
    const QwenPatching& q = p_.q.patching;
    const int tps = q.temporal_patch_size;
    Pick pick;
    int src_w = 0, src_h = 0;
    size_t frame_bytes = 0;
    FramePlan plan = [&](const VideoFacts& f) -> Result<std::vector<double>> {
      MMFEED_ASSIGN_OR_RETURN(Pick chosen, Choose(f));
      pick = std::move(chosen);
      src_w = f.width;
      src_h = f.height;
      resampler_.Plan({0, static_cast<double>(src_w) / pick.ow, 0, src_w, 0, pick.ow},
                      {0, static_cast<double>(src_h) / pick.oh, 0, src_h, 0, pick.oh},
                      Filter::kBicubic);
      frame_bytes = static_cast<size_t>(3) * pick.oh * pick.ow;
      frames_.resize(static_cast<size_t>(pick.groups) * tps * frame_bytes);
      std::vector<double> times(pick.indices.size());
      for (size_t i = 0; i < pick.indices.size(); ++i)
        times[i] = (static_cast<double>(pick.indices[i]) + 0.5) / pick.source_fps;
      return times;
    };
    ResampleOutput chw;
    chw.chw = true;  // uint8, rounded as PIL's resize returns it
    FrameSink sink = [&](int slot, const uint8_t* rgb, int w, int h) -> Status {
      if (w != src_w || h != src_h)
        return Status::Corrupt(
            fmt::format("frame size changes mid-stream ({}x{}, then {}x{})", src_w, src_h, w, h));
      const cv::Mat src(h, w, CV_8UC3, const_cast<uint8_t*>(rgb), static_cast<size_t>(w) * 3);
      resampler_.Run(src, {0, 0}, chw, frames_.data() + slot * frame_bytes);
      return Status::Ok();
    };
    Status sampled = sampler_.SampleFrames(in, plan, sink, &mask_);
    shared_->Add(sampler_.stats(), &seen_);
    MMFEED_RETURN_IF_ERROR(sampled);

    // Frames past the stream's end (a container longer than its video), then up to a whole
    // temporal patch: the last frame again, as the reference pads.
    const int n = static_cast<int>(pick.indices.size());
    const int groups = static_cast<int>(pick.groups), oh = pick.oh, ow = pick.ow;
    int last = 0;
    for (int i = 0; i < groups * tps; ++i) {
      if (i < n && mask_[i]) {
        last = i;
        continue;
      }
      if (i != last)
        std::memcpy(frames_.data() + i * frame_bytes, frames_.data() + last * frame_bytes,
                    frame_bytes);
    }
    const float* lut[3] = {p_.q.lut[0], p_.q.lut[1], p_.q.lut[2]};
    const size_t group_bytes = static_cast<size_t>(oh / q.patch_size) * (ow / q.patch_size) *
                               q.PatchValues() * DTypeSize(p_.q.dtype);
    std::vector<const uint8_t*> group(tps);
    for (int g = 0; g < groups; ++g) {
      for (int t = 0; t < tps; ++t) group[t] = frames_.data() + (g * tps + t) * frame_bytes;
      QwenPatchify(group.data(), oh, ow, q, lut, p_.q.dtype, rows + g * group_bytes);
    }
    Describe(pick, grid, seconds);
    return Status::Ok();
  }

  const QwenVideoParams& p_;
  VideoSampler sampler_;
  VideoStatsSum* shared_;
  VideoStats seen_;  // what was already added to shared_
  Resampler resampler_;
  std::vector<uint8_t> frames_;  // the resized frames, 8-bit CHW, one after another
  std::vector<uint8_t> mask_;
};

class QwenVideoStage : public Stage {
 public:
  explicit QwenVideoStage(QwenVideoParams p) : p_(std::move(p)), cache_(p_.video.index_cache) {}
  std::vector<TensorSpec> OutputSpecs() const override {
    std::vector<TensorSpec> specs = QwenOutputSpecs(p_.q);
    specs.push_back(
        {p_.q.grid_name + "_seconds", DType::kFloat32, {p_.q.max_items, p_.max_groups}});
    AddQwenCuSeqlens(p_.q, p_.max_groups, &specs);
    return specs;
  }
  std::unique_ptr<StageWorker> NewWorker() const override {
    return std::make_unique<QwenVideoWorker>(p_, &cache_, &shared_);
  }
  std::vector<std::pair<std::string, double>> Metrics() const override { return shared_.Metrics(); }
  CostOutputs Costs() const override { return {"", p_.q.name}; }
  WhyNot WhyNotCacheable() const override { return std::nullopt; }

 private:
  QwenVideoParams p_;
  // Shared by the workers, internally synchronized.
  mutable KeyframeIndexCache cache_;
  mutable VideoStatsSum shared_;
};

Result<std::unique_ptr<Stage>> MakeQwenVideoStage(const StageArgs& a) {
  RouteFfmpegLogs();
  const Params& prm = a.params;
  QwenVideoParams p;
  const int64_t tps = prm.GetInt("temporal_patch_size");
  MMFEED_RETURN_IF_ERROR(ParseQwenParams(a, "max_videos", tps, &p.q));
  p.fps = prm.GetFloat("fps");
  if (!(p.fps > 0) || p.fps > 1000) return Status::Invalid("fps must be in (0, 1000]");
  p.min_frames = prm.GetInt("min_frames");
  p.max_frames = prm.GetInt("max_frames");
  if (p.max_frames < tps || p.max_frames > 4096)
    return Status::Invalid(
        fmt::format("max_frames must be in {}..4096 (at least temporal_patch_size)", tps));
  if (p.min_frames < 1 || p.min_frames > p.max_frames)
    return Status::Invalid("min_frames must be in 1..max_frames");
  p.max_groups = (p.max_frames + tps - 1) / tps;
  p.video.max_pixels = prm.GetInt("max_source_pixels");
  if (p.video.max_pixels < 1) return Status::Invalid("max_source_pixels must be positive");
  p.video.threads = static_cast<int>(prm.GetInt("threads"));
  if (p.video.threads < 0 || p.video.threads > 64)
    return Status::Invalid("threads must be in 0..64 (0: FFmpeg picks)");
  const int64_t cache = prm.GetInt("index_cache");
  if (cache < 0) return Status::Invalid("index_cache must be >= 0");
  p.video.index_cache = static_cast<size_t>(cache);
  return std::unique_ptr<Stage>(new QwenVideoStage(std::move(p)));
}

std::vector<ParamSpec> QwenVideoParamSpecs() {
  std::vector<ParamSpec> specs = QwenParamSpecs();
  specs.insert(
      specs.end(),
      {
          Ranged({"fps", ParamType::kFloat, 2.0,
                  "frames sampled per second of video: int(frames / source fps * fps)"},
                 std::nullopt, 1000),
          Ranged({"min_frames", ParamType::kInt, int64_t{4},
                  "fewest frames sampled (if the video has them)"},
                 1, 4096),
          Ranged({"max_frames", ParamType::kInt, int64_t{768}, "most frames sampled"}, 1, 4096),
          Ranged({"min_pixels", ParamType::kInt, int64_t{131072},
                  "smart_resize: frames * height * width below this grow (128 * 32 * 32)"},
                 0, std::nullopt),
          Ranged({"max_pixels", ParamType::kInt, int64_t{786432},
                  "smart_resize: frames * height * width above this shrink (768 * 32 * 32); also "
                  "sizes the ring (max_pixels / patch_size^2 patches per video)"},
                 std::nullopt, 1073741824),
          {"grid", ParamType::kString, std::string("video_grid_thw"),
           "name of the grid output ([t, h, w]; <grid>_count, <grid>_seconds)"},
          Ranged(
              {"max_videos", ParamType::kInt, int64_t{1},
               "the most videos a sample's field may list (\"videos\": [...]); the ring reserves "
               "max_videos * max_pixels / patch_size^2 patches per sample"},
              1, kMaxListItems),
          Ranged({"max_source_pixels", ParamType::kInt, int64_t{7680} * 4320,
                  "refuse videos with larger frames, before allocating"},
                 1, std::nullopt),
          Ranged({"threads", ParamType::kInt, int64_t{1},
                  "decoder threads per worker (workers are the main parallelism)"},
                 0, 64),
          Ranged({"index_cache", ParamType::kInt, int64_t{4096},
                  "files whose keyframe index is kept (LRU)"},
                 0, std::nullopt),
      });
  return specs;
}

MMFEED_REGISTER_STAGE((StageSchema{
    "qwen_video",
    "a video as Qwen3-VL/Qwen3.5 vision encoders take it (Hugging Face's Qwen3VLVideoProcessor): "
    "frames at fps, smart_resize over all frames, PIL's antialiased bicubic, normalize, patches "
    "in the reference's order; one video or a list. Outputs (ragged): <name> [patches, 3 * "
    "temporal_patch_size * patch_size^2], <grid> int32 [videos, 3] (t, h, w in patches), "
    "<grid>_count int32 [], <grid>_seconds float32 [max_videos, ceil(max_frames / "
    "temporal_patch_size)] (each temporal patch's time, to 0.1 s)",
    StageKind::kField,
    /*field_is_path=*/true, QwenVideoParamSpecs(), MakeQwenVideoStage}));

}  // namespace
}  // namespace mmfeed
