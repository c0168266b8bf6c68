#include "stages/video/video_sampler.h"

#include <mutex>

extern "C" {
#include <libavutil/cpu.h>
#include <libswscale/swscale.h>
}

namespace mmfeed {
namespace {

// swscale's AVX2 horizontal scalers gather their source pixels; on AMD's cores the SSSE3/SSE4 ones
// that load them are faster (wan2.2-t2v's clips 1.03x from 1080p, 1.045x from 720p on a Zen 5
// EPYC; FFmpeg 5.1 marks no AMD core this way), and both give the same bytes (FFmpeg's checkasm
// holds every scaler to the C one; CoverTest compares with PyAV's, which gathers). So on AMD
// CPUs FFmpeg is told its gathers are slow, once, before the first scaler is made. The flag
// only steers code that has a gather-free twin.
void PreferGatherFreeScalers() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (__builtin_cpu_is("amd")) av_force_cpu_flags(av_get_cpu_flags() | AV_CPU_FLAG_SLOW_GATHER);
  });
}

}  // namespace

// ---- VideoStats ----

VideoStats& VideoStats::operator+=(const VideoStats& o) {
  videos += o.videos;
  sampled += o.sampled;
  decoded += o.decoded;
  seeks += o.seeks;
  skipped += o.skipped;
  index_hits += o.index_hits;
  index_misses += o.index_misses;
  return *this;
}

VideoStats VideoStats::operator-(const VideoStats& o) const {
  VideoStats d = *this;
  d.videos -= o.videos;
  d.sampled -= o.sampled;
  d.decoded -= o.decoded;
  d.seeks -= o.seeks;
  d.skipped -= o.skipped;
  d.index_hits -= o.index_hits;
  d.index_misses -= o.index_misses;
  return d;
}

void VideoStatsSum::Add(const VideoStats& stats, VideoStats* seen) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    sum_ += stats - *seen;
  }
  *seen = stats;
}

std::vector<std::pair<std::string, double>> VideoStatsSum::Metrics() const {
  VideoStats sum;
  {
    std::lock_guard<std::mutex> lock(mu_);
    sum = sum_;
  }
  return {{"decoded_per_sampled", sum.DecodedPerSampled()},
          {"seeks_per_video", sum.SeeksPerVideo()},
          {"index_hits", static_cast<double>(sum.index_hits)},
          {"index_misses", static_cast<double>(sum.index_misses)}};
}

// ---- KeyframeIndexCache ----

std::shared_ptr<const KeyframeIndex> KeyframeIndexCache::Find(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = map_.find(key);
  if (it == map_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->second;
}

void KeyframeIndexCache::Put(const std::string& key, std::shared_ptr<const KeyframeIndex> index) {
  if (capacity_ == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = map_.find(key);
  if (it != map_.end()) {
    it->second->second = std::move(index);
    lru_.splice(lru_.begin(), lru_, it->second);
    return;
  }
  lru_.emplace_front(key, std::move(index));
  map_[key] = lru_.begin();
  if (lru_.size() > capacity_) {
    map_.erase(lru_.back().first);
    lru_.pop_back();
  }
}

size_t KeyframeIndexCache::size() {
  std::lock_guard<std::mutex> lock(mu_);
  return lru_.size();
}

// ---- VideoSampler ----

VideoSampler::VideoSampler(const VideoOptions& options, KeyframeIndexCache* cache)
    : o_(options), cache_(cache) {
  PreferGatherFreeScalers();
}

VideoSampler::~VideoSampler() {
  sws_freeContext(sws_);
  sws_freeContext(yuv_sws_);
}

size_t VideoSampler::FrameBytes() const {
  return static_cast<size_t>(o_.out_h) * o_.out_w * 3 * DTypeSize(o_.pixels.dtype);
}

std::vector<TensorSpec> VideoOutputSpecs(const std::string& name, const VideoOptions& o) {
  const int64_t T = o.frames, H = o.out_h, W = o.out_w;
  TensorSpec frames{name, o.pixels.dtype,
                    o.layout == VideoLayout::kTHWC   ? std::vector<int64_t>{T, H, W, 3}
                    : o.layout == VideoLayout::kCTHW ? std::vector<int64_t>{3, T, H, W}
                                                     : std::vector<int64_t>{T, 3, H, W}};
  return {frames, {name + "_pts", DType::kFloat32, {T}}, {name + "_mask", DType::kUInt8, {T}}};
}

}  // namespace mmfeed
