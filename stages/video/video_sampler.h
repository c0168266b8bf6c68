// Sampling T frames from a video with FFmpeg, decoding only what the sampling needs.
//
// Which frame: every sampling mode turns into T target times; the frame for time t is the one
// on screen at t, i.e. the last frame (in presentation order) with pts <= t, or the first frame
// if t is before it. Times are seconds from the video stream's start; a target at or after
// the stream's end is padding (mask 0). A reference that decodes every frame and applies this
// rule picks the same frames (tests/integration/video_reference_test.py checks it with PyAV).
//
// How it stays cheap (see docs/design/video.md):
// - seeks to the keyframe before a target when that skips frames, and otherwise decodes
//   forward; keyframe positions come from the container's index, kept per file in a bounded
//   LRU shared by a stage's workers (containers without an index are scanned once);
// - asks the decoder to skip non-reference frames that cannot be picked (another packet's pts
//   lies between them and the next target);
// - converts and resizes only picked frames, with swscale, straight into the output;
// - stops at the last target.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/rng.h"
#include "base/status.h"
#include "base/tensor.h"
#include "engine/registry.h"
#include "engine/stage.h"
#include "stages/video/rgb24_out.h"

struct SwsContext;

namespace mmfeed {

enum class VideoSampling { kUniform, kClip, kKeyframes, kTimestamps };
enum class VideoPad { kRepeatLast, kZeros };
// TCHW: [T,3,H,W]; THWC: [T,H,W,3]; CTHW: [3,T,H,W] (channels first over time, as Wan's and
// most video diffusion models' VAEs take a clip).
enum class VideoLayout { kTCHW, kTHWC, kCTHW };
// stretch: the whole frame to the output size; cover: scaled keeping its aspect ratio to cover
// the output, then center-cropped (the crop is taken from the source frame, its left and top
// edges on the chroma grid: even pixels for 4:2:0).
enum class VideoResize { kStretch, kCover };
// Where the resize works: rgb24 (swscale resizes and converts to RGB24 in one call: the bytes
// PyAV's reformat(width, height, 'rgb24') gives) or yuv (swscale resizes the decoder's planes at
// their own chroma subsampling, then converts the frame at the output size: about 3x less work,
// chroma interpolated at the planes' resolution; docs/design/video.md says how far from rgb24).
enum class VideoScaleIn { kRgb24, kYuv };

struct VideoOptions {
  VideoSampling sampling = VideoSampling::kUniform;
  int frames = 16;                 // T
  double fps = 4;                  // clip: target rate
  double clip_start = -1;          // clip: seconds from the start; < 0: random, seeded per sample
  std::vector<double> timestamps;  // timestamps: seconds from the start (T = its size)
  int out_h = 224, out_w = 224;
  VideoLayout layout = VideoLayout::kTCHW;
  VideoResize resize = VideoResize::kStretch;
  Rgb24Out pixels;  // the frames' dtype, and for float32, bfloat16 the factors
  VideoPad pad = VideoPad::kRepeatLast;
  int sws_flags = 2;  // SWS_BILINEAR
  VideoScaleIn scale_in = VideoScaleIn::kRgb24;
  int threads = 1;                     // decoder threads per worker
  int64_t max_pixels = 7680LL * 4320;  // refuse larger frames before allocating anything
  size_t index_cache = 4096;           // files whose keyframe index is kept
};

// Builds options from a `video` stage's validated params (the schema is in video_stage.cc).
Result<VideoOptions> VideoOptionsFromParams(const Params& params);

// Per-sample outputs: frames [T,3,H,W], [T,H,W,3] or [3,T,H,W], pts float32 [T] (seconds),
// mask uint8 [T].
std::vector<TensorSpec> VideoOutputSpecs(const std::string& name, const VideoOptions& o);

// Counters of one sampler, for benchmarks and the profile.
struct VideoStats {
  int64_t videos = 0;
  int64_t sampled = 0;  // frames written that came from the video (mask 1)
  int64_t decoded = 0;  // frames the decoder produced
  int64_t seeks = 0;
  int64_t skipped = 0;  // packets sent with "skip if not a reference frame"
  int64_t index_hits = 0, index_misses = 0;

  VideoStats& operator+=(const VideoStats& o);
  VideoStats operator-(const VideoStats& o) const;
  double DecodedPerSampled() const {
    return sampled ? static_cast<double>(decoded) / sampled : 0.0;
  }
  double SeeksPerVideo() const { return videos ? static_cast<double>(seeks) / videos : 0.0; }
};

// The VideoStats of a stage's workers summed, for the profile; thread-safe.
class VideoStatsSum {
 public:
  // Adds what `stats` counted since the last call with `*seen`, and remembers it there.
  void Add(const VideoStats& stats, VideoStats* seen);
  // decoded_per_sampled, seeks_per_video, index_hits, index_misses.
  std::vector<std::pair<std::string, double>> Metrics() const;

 private:
  mutable std::mutex mu_;
  VideoStats sum_;
};

// Keyframe positions of one file.
struct KeyframeIndex {
  std::vector<int64_t>
      key_ts;  // ascending, as the demuxer's index has them (stream units; MP4: decoding times)
  int64_t pts_offset = 0;  // a keyframe's pts minus its key_ts (MP4: the reorder delay; else 0)
  int64_t end_ts =
      INT64_MIN;  // from a scan, when the container declares no duration; INT64_MIN: unknown
  // From a scan of a container without an index (MPEG-TS): each keyframe's byte position, to
  // seek by byte (its demuxer seeks by time only roughly, and not to keyframes).
  std::vector<int64_t> key_pos;
};

// Bounded LRU of keyframe indexes keyed by AvInput::identity(); thread-safe.
class KeyframeIndexCache {
 public:
  explicit KeyframeIndexCache(size_t capacity) : capacity_(capacity) {}
  std::shared_ptr<const KeyframeIndex> Find(const std::string& key);
  void Put(const std::string& key, std::shared_ptr<const KeyframeIndex> index);
  size_t size();

 private:
  using Entry = std::pair<std::string, std::shared_ptr<const KeyframeIndex>>;
  std::mutex mu_;
  size_t capacity_;
  std::list<Entry> lru_;  // most recent first
  std::unordered_map<std::string, std::list<Entry>::iterator> map_;
};

// What a video stream declares about itself, for callers that choose frames once it is open.
struct VideoFacts {
  int width = 0, height = 0;
  double fps = 0;       // average frame rate (else the base rate); 0: unknown
  int64_t frames = 0;   // frame count: the stream's, else duration * fps rounded; 0: unknown
  double duration = 0;  // seconds
};

// Chooses the target times (seconds from the stream's start, one per output slot).
using FramePlan = std::function<Result<std::vector<double>>(const VideoFacts&)>;
// Takes a picked frame as RGB24 at the video's own size (width * 3 bytes a row).
using FrameSink = std::function<Status(int slot, const uint8_t* rgb, int width, int height)>;

// One per worker thread.
class VideoSampler {
 public:
  VideoSampler(const VideoOptions& options, KeyframeIndexCache* cache);
  ~VideoSampler();
  VideoSampler(const VideoSampler&) = delete;
  VideoSampler& operator=(const VideoSampler&) = delete;

  // Samples `in` into frames/pts/mask (sized as VideoOutputSpecs says). `rng` draws the clip
  // start. Errors are per sample: unreadable container, no video stream, frame size over
  // max_pixels, no frames, damaged sampled frames, truncation.
  Status Sample(const FieldValue& in, Rng* rng, uint8_t* frames, float* pts, uint8_t* mask);

  // Samples the frames `plan` chooses (the same picking rule, seeks and skips as Sample) and
  // hands each to `sink`, in decoding order; a slot whose time is past the end of the stream is
  // not handed over. `mask` gets 1 for each slot handed over.
  Status SampleFrames(const FieldValue& in, const FramePlan& plan, const FrameSink& sink,
                      std::vector<uint8_t>* mask);
  // What SampleFrames' plan would be given, without decoding a frame.
  Result<VideoFacts> Probe(const FieldValue& in);

  const VideoStats& stats() const { return stats_; }

 private:
  struct Run;
  friend struct Run;
  size_t FrameBytes() const;
  size_t PlaneBytes() const { return FrameBytes() / 3; }

  const VideoOptions& o_;
  KeyframeIndexCache* cache_;
  VideoStats stats_;
  SwsContext* sws_ = nullptr;
  std::vector<uint8_t> rgb_;       // planar or float output: swscale writes RGB24 here first
  SwsContext* yuv_sws_ = nullptr;  // scale_in yuv: the planes' resize
  std::vector<uint8_t> yuv_;       // scale_in yuv: the resized planes
};

}  // namespace mmfeed
