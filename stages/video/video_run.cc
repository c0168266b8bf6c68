// VideoSampler's work: one Sample(), Probe() or SampleFrames() call is a Run, which opens the
// input, reads its timeline, plans the frames, then seeks and decodes as little as it can
// (docs/design/video.md). The sampler's stats, keyframe cache and output specs: video_sampler.cc.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <limits>

#include "stages/video/rgb24_out.h"
#include "stages/video/video_sampler.h"

extern "C" {
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/imgutils.h>
#include <libavutil/pixdesc.h>
#include <libswscale/swscale.h>
}

#include "stages/ffmpeg/av_input.h"

namespace mmfeed {
namespace {

constexpr int64_t kNoPts = AV_NOPTS_VALUE;
constexpr int64_t kNothing = std::numeric_limits<int64_t>::min();
// Packets read ahead of the decoder: more than any codec's reordering depth, so the window
// holds every packet whose pts lies just after the one being sent.
constexpr size_t kLookahead = 16;
// Seek only when it skips at least this many frames; below, decoding forward is as cheap.
constexpr int64_t kSeekMinFrames = 2;
// Bytes swscale may write past an RGB24 image converted without resizing (blocks of 16
// pixels), and past a plane's row when it resizes planes.
constexpr size_t kSwscaleSlack = 64;
// The most frames a FramePlan may choose.
constexpr int kMaxPlannedFrames = 4096;

struct Target {
  int64_t ts;  // stream units
  int slot;    // output position
};

// Seconds from the stream's start to stream units, so that a frame at exactly t (to within
// a microsecond) counts as on screen at t.
int64_t SecondsToTs(double seconds, AVRational tb) {
  return static_cast<int64_t>(std::floor((seconds + 1e-6) * tb.den / tb.num));
}

// A decoded frame's presentation time; kNoPts if unknown.
int64_t FramePts(const AVFrame* f) {
  return f->best_effort_timestamp != kNoPts ? f->best_effort_timestamp : f->pts;
}

// The keyframes the demuxer's index lists, in its seek timestamps.
std::vector<int64_t> IndexKeyframes(AVStream* st) {
  std::vector<int64_t> out;
  const int n = avformat_index_get_entries_count(st);
  for (int i = 0; i < n; ++i) {
    const AVIndexEntry* e = avformat_index_get_entry(st, i);
    if (e && (e->flags & AVINDEX_KEYFRAME) && (out.empty() || e->timestamp > out.back()))
      out.push_back(e->timestamp);
  }
  return out;
}

}  // namespace

// ---- One Sample() call ----

struct VideoSampler::Run {
  VideoSampler& vs;
  const VideoOptions& o;
  uint8_t* frames;
  float* pts_out;
  uint8_t* mask;
  int T;                            // output slots
  const FrameSink* sink = nullptr;  // SampleFrames: picked frames go here, not to `frames`
  std::vector<float> sink_pts;      // SampleFrames: pts_out
  int rgb_w = 0, rgb_h = 0;         // SampleFrames: the frame in vs.rgb_

  AvInput input;
  AVFormatContext* fmt = nullptr;
  AVStream* st = nullptr;
  int si = -1;
  AVCodecContext* codec = nullptr;
  AVPacket* pkt = nullptr;
  AVFrame* frame = nullptr;
  // The last frame out of the decoder: the pick for targets before the next.
  AVFrame* prev = nullptr;
  bool have_prev = false;
  int64_t prev_pts = 0;
  bool prev_damaged = false;
  // A damaged frame was decoded since the last keyframe: later ones may show it.
  bool tainted = false;
  std::deque<AVPacket*> window;  // read, not yet sent
  bool demux_eof = false;
  bool seekable = true;
  bool lost = false;              // a seek back to the start failed half-way: position unknown
  int64_t first_packet = kNoPts;  // decoding time of the stream's first packet

  AVRational tb{1, 1};
  double tb_sec = 0;
  int64_t frame_dur = 1;
  int64_t start_ts = 0, end_ts = kNoPts;
  bool end_from_stream = false;  // the stream itself declares its duration (MP4 does)
  std::shared_ptr<const KeyframeIndex> index;

  std::vector<Target> targets;  // valid targets, ascending
  size_t next = 0;              // first unresolved
  int cur_key = 0;              // keyframe the decoder started from
  bool first_after_seek = false;
  int retry_target = -1, retry_cap = 0;  // a seek that landed past targets[retry_target]
  int64_t fed_max = kNothing;            // largest pts sent to the decoder since the last seek
  std::deque<int64_t> sent_pts;          // pts of the last kLookahead packets sent since then
  int written_slot = -1;
  int64_t written_pts = kNoPts;

  int bad = 0;
  std::string first_bad;
  int damaged_picks = 0;
  double first_damaged = 0;

  Run(VideoSampler& v, uint8_t* f, float* p, uint8_t* m)
      : vs(v), o(v.o_), frames(f), pts_out(p), mask(m), T(v.o_.frames) {}
  ~Run() {
    for (AVPacket* p : window) av_packet_free(&p);
    av_frame_free(&prev);
    av_frame_free(&frame);
    av_packet_free(&pkt);
    avcodec_free_context(&codec);
  }

  int64_t KeyPts(size_t k) const { return index->key_ts[k] + index->pts_offset; }
  double Seconds(int64_t ts) const { return (ts - start_ts) * tb_sec; }

  void NoteBad(std::string what) {
    if (bad++ == 0) first_bad = std::move(what);
  }

  Status Open(const FieldValue& in) {
    MMFEED_RETURN_IF_ERROR(input.Open(in, "video"));
    fmt = input.fmt();
    const AVCodec* decoder = nullptr;
    si = av_find_best_stream(fmt, AVMEDIA_TYPE_VIDEO, -1, -1, &decoder, 0);
    if (si == AVERROR_STREAM_NOT_FOUND) return Status::Corrupt("no video stream");
    if (si < 0 || !decoder) {
      const AVCodecDescriptor* d =
          si >= 0 ? avcodec_descriptor_get(fmt->streams[si]->codecpar->codec_id) : nullptr;
      return Status::Unsupported(
          fmt::format("no decoder for the video codec ({})", d ? d->name : "unknown"));
    }
    st = fmt->streams[si];
    if (st->disposition & AV_DISPOSITION_ATTACHED_PIC)
      return Status::Corrupt("no video stream (only a cover picture)");
    for (unsigned i = 0; i < fmt->nb_streams; ++i)
      if (static_cast<int>(i) != si)
        fmt->streams[i]->discard = AVDISCARD_ALL;  // audio goes to the audio stage
    const AVCodecParameters* par = st->codecpar;
    // Containers without stream headers (MPEG-TS) need a look at the first frames.
    if ((par->width <= 0 || par->height <= 0) && avformat_find_stream_info(fmt, nullptr) < 0)
      return Status::Corrupt("cannot read the video stream's parameters");
    if (par->width <= 0 || par->height <= 0)
      return Status::Corrupt("the video stream declares no frame size");
    if (static_cast<int64_t>(par->width) * par->height > o.max_pixels)
      return Status::TooLarge(fmt::format("frame size {}x{} is over max_pixels {}", par->width,
                                          par->height, o.max_pixels));
    codec = avcodec_alloc_context3(decoder);
    if (!codec) return Status::Io("out of memory (AVCodecContext)");
    avcodec_parameters_to_context(codec, par);
    codec->thread_count = o.threads;
    codec->thread_type = FF_THREAD_FRAME | FF_THREAD_SLICE;
    codec->max_pixels =
        o.max_pixels;  // the decoder refuses a larger frame (a size change mid-stream)
    codec->pkt_timebase = st->time_base;
    int err = avcodec_open2(codec, decoder, nullptr);
    if (err < 0)
      return Status::Unsupported(
          fmt::format("cannot open the {} decoder: {}", decoder->name, AvError(err)));
    pkt = av_packet_alloc();
    frame = av_frame_alloc();
    prev = av_frame_alloc();
    if (!pkt || !frame || !prev) return Status::Io("out of memory (AVFrame)");

    tb = st->time_base;
    tb_sec = av_q2d(tb);
    AVRational rate = st->avg_frame_rate.num > 0 ? st->avg_frame_rate : st->r_frame_rate;
    frame_dur = rate.num > 0 && rate.den > 0 ? av_rescale_q(1, av_inv_q(rate), tb)
                                             : av_rescale_q(1, {1, 25}, tb);
    frame_dur = std::max<int64_t>(frame_dur, 1);
    seekable = fmt->pb && (fmt->pb->seekable & AVIO_SEEKABLE_NORMAL);
    return Status::Ok();
  }

  // av_read_frame, retrying EAGAIN (a demuxer waiting for data) a bounded number of times.
  int ReadPacket() {
    if (SampleDeadlinePassed()) return AVERROR_EXIT;
    int e = 0;
    for (int tries = 0; tries < 1000 && (e = av_read_frame(fmt, pkt)) == AVERROR(EAGAIN); ++tries) {
    }
    return e;
  }

  // Reads packets of the video stream into the window, up to kLookahead.
  void FillWindow() {
    while (!demux_eof && window.size() < kLookahead) {
      int e = ReadPacket();
      if (e < 0) {
        demux_eof = true;
        if (e != AVERROR_EOF) NoteBad(fmt::format("read error: {}", AvError(e)));
        return;
      }
      if (pkt->stream_index != si) {
        av_packet_unref(pkt);
        continue;
      }
      AVPacket* q = av_packet_alloc();
      av_packet_move_ref(q, pkt);
      window.push_back(q);
    }
  }

  void ClearWindow() {
    for (AVPacket* p : window) av_packet_free(&p);
    window.clear();
    demux_eof = false;
  }

  // Start, end and keyframe index. Leaves the demuxer at the start of the stream.
  Status Timeline() {
    FillWindow();
    if (window.empty())
      return bad ? Status::Corrupt("no readable video packets: " + first_bad)
                 : Status::Corrupt("zero-length video: the video stream has no frames");
    const AVPacket* first = window.front();
    first_packet = DecodeTime(first);
    start_ts = st->start_time != kNoPts ? st->start_time : first->pts != kNoPts ? first->pts : 0;
    if (st->duration > 0) {
      end_ts = start_ts + st->duration;
      end_from_stream = true;
    } else if (fmt->duration > 0 &&
               fmt->duration_estimation_method != AVFMT_DURATION_FROM_BITRATE) {
      end_ts = start_ts + av_rescale_q(fmt->duration, AV_TIME_BASE_Q,
                                       tb);  // a guess from the bitrate is no end
    }
    const std::string& key = input.identity();
    if (!key.empty()) index = vs.cache_->Find(key);
    if (index) {
      ++vs.stats_.index_hits;
    } else {
      ++vs.stats_.index_misses;
      auto built = std::make_shared<KeyframeIndex>();
      if (first->pts != kNoPts && first->dts != kNoPts) built->pts_offset = first->pts - first->dts;
      // MPEG-TS/PS have no index; their seeks by time land on any packet and leave it in the
      // index as a "keyframe", so they are always scanned and sought by byte.
      const bool rough = fmt->iformat->flags & AVFMT_TS_DISCONT;
      // Matroska reads its cues on the first seek, and until then lists only the keyframes
      // it has read; the seek back to the start costs nothing where the index is in the header.
      if (!rough) {
        if (seekable && !Rewind())
          return Status::Unsupported("cannot seek back to the start of the video stream");
        built->key_ts = IndexKeyframes(st);
      }
      if (built->key_ts.empty() || end_ts == kNoPts || Partial(*built))
        MMFEED_RETURN_IF_ERROR(Scan(built.get(), rough));
      index = built;
      if (!key.empty()) vs.cache_->Put(key, index);
    }
    if (end_ts == kNoPts) end_ts = index->end_ts;
    return Status::Ok();
  }

  // An index that holds only what the demuxer has read so far (Matroska without cues) ends
  // well before the stream: more than twice its longest GOP and 2 s. A complete one ends at
  // the last frame (MP4) or the last keyframe (cues).
  bool Partial(const KeyframeIndex& k) const {
    const int n = avformat_index_get_entries_count(st);
    if (n == 0 || end_ts == kNoPts) return false;
    const int64_t last = avformat_index_get_entry(st, n - 1)->timestamp + k.pts_offset;
    int64_t gop = 0;
    for (size_t i = 1; i < k.key_ts.size(); ++i) gop = std::max(gop, k.key_ts[i] - k.key_ts[i - 1]);
    return end_ts - last > std::max(2 * gop, av_rescale_q(2, {1, 1}, tb));
  }

  // A container without an index or a duration: read every packet once (no decoding), from
  // the start (where Timeline() left the demuxer, with the window's packets already read).
  Status Scan(KeyframeIndex* k, bool rough) {
    std::vector<int64_t> keys, positions;
    int64_t end = kNoPts;
    auto note = [&](const AVPacket* q) {
      if (q->stream_index != si || q->pts == kNoPts) return;
      if ((q->flags & AV_PKT_FLAG_KEY) && q->pos >= 0 && (keys.empty() || q->pts > keys.back())) {
        keys.push_back(q->pts);
        positions.push_back(q->pos);
      }
      end = std::max(end == kNoPts ? q->pts : end,
                     q->pts + (q->duration > 0 ? q->duration : frame_dur));
    };
    for (const AVPacket* q : window) note(q);
    ClearWindow();
    while (ReadPacket() >= 0) {
      note(pkt);
      av_packet_unref(pkt);
    }
    k->end_ts = end;
    // Prefer an index the demuxer built while reading (Matroska without cues): it is in the
    // demuxer's seek units.
    k->key_ts = rough ? std::vector<int64_t>{} : IndexKeyframes(st);
    if (k->key_ts.empty()) {
      k->key_ts = std::move(keys);
      k->key_pos = std::move(positions);
      k->pts_offset = 0;
    }
    if (!Rewind())
      return Status::Unsupported("the container has no index and cannot seek back to the start");
    return Status::Ok();
  }

  static int64_t DecodeTime(const AVPacket* p) { return p->dts != kNoPts ? p->dts : p->pts; }

  // Puts the demuxer back at the stream's first packet, with the window refilled from there.
  // Some demuxers (MPEG-TS) seek by time only roughly; then a seek to byte 0 does it.
  bool Rewind() {
    if (!seekable) return false;
    auto at_start = [&] {
      ClearWindow();
      FillWindow();
      return !window.empty() &&
             (first_packet == kNoPts || DecodeTime(window.front()) <= first_packet);
    };
    if (av_seek_frame(fmt, si, start_ts, AVSEEK_FLAG_BACKWARD) >= 0 && at_start()) return true;
    return av_seek_frame(fmt, -1, 0, AVSEEK_FLAG_BYTE) >= 0 && at_start();
  }

  // Target times of the uniform, clip and timestamps modes.
  Status MakeTargets(Rng* rng) {
    const double duration = Seconds(end_ts);
    std::vector<double> t(T);
    switch (o.sampling) {
      case VideoSampling::kUniform:
        for (int i = 0; i < T; ++i) t[i] = (i + 0.5) * duration / T;
        break;
      case VideoSampling::kClip: {
        const double span = T / o.fps;
        double s = o.clip_start;
        if (s < 0)
          s = duration > span ? rng->Uniform() * (duration - span) : 0.0;
        else if (s >= duration)
          return Status::Invalid(fmt::format(
              "clip_start {:.3f}s is past the end of the video ({:.3f}s)", s, duration));
        for (int i = 0; i < T; ++i) t[i] = s + i / o.fps;
        break;
      }
      case VideoSampling::kTimestamps:
        t = o.timestamps;
        break;
      case VideoSampling::kKeyframes:
        break;
    }
    return SetTargets(t);
  }

  // One target per slot, at `t` seconds; a target past the end is padding.
  Status SetTargets(const std::vector<double>& t) {
    const double duration = Seconds(end_ts);
    for (int i = 0; i < T; ++i)
      if (t[i] < duration) targets.push_back({start_ts + SecondsToTs(t[i], tb), i});
    std::stable_sort(targets.begin(), targets.end(),
                     [](const Target& a, const Target& b) { return a.ts < b.ts; });
    if (targets.empty())
      return Status::Invalid(
          fmt::format("every timestamp is past the end of the video ({:.3f}s)", duration));
    return Status::Ok();
  }

  void Seek(int k) {
    // Demuxers seek by presentation time (MP4 too, though its index holds decoding times).
    // The first keyframe is the start, where Rewind() makes sure to land.
    if (k == 0) {
      if (!Rewind()) {
        lost = seekable;
        seekable = false;
        return;
      }
    } else if (!seekable ||
               (index->key_pos.empty()
                    ? av_seek_frame(fmt, si, KeyPts(k), AVSEEK_FLAG_BACKWARD)
                    : av_seek_frame(fmt, -1, index->key_pos[k], AVSEEK_FLAG_BYTE)) < 0) {
      seekable = false;  // keep decoding forward from where we are
      return;
    } else {
      ClearWindow();
    }
    avcodec_flush_buffers(codec);
    av_frame_unref(prev);
    have_prev = false;
    tainted = false;
    fed_max = kNothing;
    sent_pts.clear();
    cur_key = k;
    first_after_seek = true;
    ++vs.stats_.seeks;
  }

  // Seeks when the keyframe before the next target lies ahead of where the decoder is.
  void MaybeSeek() {
    if (!seekable || index->key_ts.empty() || next >= targets.size()) return;
    const int64_t t = targets[next].ts;
    int k = static_cast<int>(std::upper_bound(index->key_ts.begin(), index->key_ts.end(),
                                              t - index->pts_offset) -
                             index->key_ts.begin()) -
            1;
    if (static_cast<int>(next) == retry_target) k = std::min(k, retry_cap);
    if (k <= cur_key) return;
    int64_t pos = std::max(fed_max, have_prev ? prev_pts : kNothing);
    if (pos == kNothing) pos = KeyPts(cur_key);
    if (KeyPts(k) - pos >= kSeekMinFrames * frame_dur) Seek(k);
  }

  // True if a packet can be decoded with "skip unless a reference frame": another packet's
  // pts lies between it and the next target, so it cannot be picked. The other packet may come
  // later in decoding order (the window) or earlier (sent: with B-frames, a frame shown later
  // is often decoded first).
  bool Skippable(const AVPacket* p) const {
    if (p->pts == kNoPts || (p->flags & AV_PKT_FLAG_KEY)) return false;
    auto it = std::lower_bound(targets.begin() + next, targets.end(), p->pts,
                               [](const Target& a, int64_t v) { return a.ts < v; });
    if (it == targets.end()) return true;  // after the last target
    auto hides = [&](int64_t q) { return q != kNoPts && q > p->pts && q <= it->ts; };
    for (const AVPacket* q : window)
      if (hides(q->pts)) return true;
    return std::any_of(sent_pts.begin(), sent_pts.end(), hides);
  }

  size_t FrameBytes() const { return vs.FrameBytes(); }

  // Channel c of frame `slot` in a planar layout (TCHW, CTHW).
  uint8_t* Plane(int slot, int c) const {
    if (o.layout == VideoLayout::kCTHW)
      return frames + (static_cast<size_t>(c) * T + slot) * vs.PlaneBytes();
    return frames + slot * FrameBytes() + c * vs.PlaneBytes();
  }

  // Frame `slot` as FrameParts() contiguous runs of PartBytes(): the frame itself, or in CTHW
  // its three channel planes.
  int FrameParts() const { return o.layout == VideoLayout::kCTHW ? 3 : 1; }
  size_t PartBytes() const { return FrameBytes() / FrameParts(); }
  uint8_t* FramePart(int slot, int part) const {
    return o.layout == VideoLayout::kCTHW ? Plane(slot, part) : frames + slot * FrameBytes();
  }

  void CopyFrame(int to, int from) const {
    for (int p = 0; p < FrameParts(); ++p)
      std::memcpy(FramePart(to, p), FramePart(from, p), PartBytes());
  }

  void ZeroFrame(int slot) const {
    for (int p = 0; p < FrameParts(); ++p) std::memset(FramePart(slot, p), 0, PartBytes());
  }

  // resize: cover reads the largest centered region with the output's aspect ratio, its left
  // and top edges rounded down to the chroma grid so that every plane starts on a sample:
  // points `src` at its top-left pixel in each plane and returns its size.
  static void CoverCrop(const AVFrame* f, int W, int H, const uint8_t* src[4], int* cw, int* ch) {
    const auto* d = av_pix_fmt_desc_get(static_cast<AVPixelFormat>(f->format));
    const double scale =
        std::max(static_cast<double>(W) / f->width, static_cast<double>(H) / f->height);
    *cw = std::clamp(static_cast<int>(std::lround(W / scale)), 1, f->width);
    *ch = std::clamp(static_cast<int>(std::lround(H / scale)), 1, f->height);
    const int x = ((f->width - *cw) / 2) & ~((1 << d->log2_chroma_w) - 1);
    const int y = ((f->height - *ch) / 2) & ~((1 << d->log2_chroma_h) - 1);
    for (int p = 0; p < 4; ++p) src[p] = f->data[p];
    const bool chroma_planes = !(d->flags & AV_PIX_FMT_FLAG_RGB);
    for (int c = 0; c < d->nb_components; ++c) {
      const AVComponentDescriptor& comp = d->comp[c];
      if (comp.plane == 0 && c != 0) continue;  // packed: plane 0 is offset once, by component 0
      if ((d->flags & AV_PIX_FMT_FLAG_PAL) && comp.plane != 0) continue;  // the palette
      const bool sub = chroma_planes && (c == 1 || c == 2);
      src[comp.plane] =
          f->data[comp.plane] +
          static_cast<ptrdiff_t>(sub ? y >> d->log2_chroma_h : y) * f->linesize[comp.plane] +
          static_cast<ptrdiff_t>(sub ? x >> d->log2_chroma_w : x) * comp.step;
    }
  }

  // Planar YUV without alpha or palette: what scale_in yuv resizes in its own format.
  static bool PlanarYuv(AVPixelFormat format) {
    const auto* d = av_pix_fmt_desc_get(format);
    return d && d->nb_components == 3 && (d->flags & AV_PIX_FMT_FLAG_PLANAR) &&
           !(d->flags & (AV_PIX_FMT_FLAG_RGB | AV_PIX_FMT_FLAG_PAL | AV_PIX_FMT_FLAG_HWACCEL |
                         AV_PIX_FMT_FLAG_BITSTREAM));
  }

  // scale_in yuv: resizes the planes `src` points at (sw x sh) to W x H in the same format into
  // vs.yuv_, and points `src` and `strides` there.
  Status ScalePlanes(AVPixelFormat format, int W, int H, const uint8_t* src[4],
                     const int* src_strides, int sw, int sh, int strides[4]) {
    vs.yuv_sws_ = sws_getCachedContext(vs.yuv_sws_, sw, sh, format, W, H, format, o.sws_flags,
                                       nullptr, nullptr, nullptr);
    if (!vs.yuv_sws_)
      return Status::Unsupported(
          fmt::format("cannot resize pixel format {}", av_get_pix_fmt_name(format)));
    // Rows of a multiple of 32 bytes, each plane 32-byte aligned (swscale's SIMD paths want
    // it), and slack after the last.
    if (av_image_fill_linesizes(strides, format, W) < 0)
      return Status::Unsupported(
          fmt::format("cannot resize pixel format {}", av_get_pix_fmt_name(format)));
    ptrdiff_t offsets[5] = {};
    const auto* d = av_pix_fmt_desc_get(format);
    for (int p = 0; p < 3; ++p) {
      strides[p] = FFALIGN(strides[p], 32);
      const int rows = p == 0 ? H : AV_CEIL_RSHIFT(H, d->log2_chroma_h);
      offsets[p + 1] = offsets[p] + static_cast<ptrdiff_t>(strides[p]) * rows;
    }
    vs.yuv_.resize(static_cast<size_t>(offsets[3]) + 32 + kSwscaleSlack);
    uint8_t* base = vs.yuv_.data() + (-reinterpret_cast<uintptr_t>(vs.yuv_.data()) & 31);
    uint8_t* planes[4] = {base + offsets[0], base + offsets[1], base + offsets[2], nullptr};
    sws_scale(vs.yuv_sws_, src, src_strides, 0, sh, planes, strides);
    for (int p = 0; p < 4; ++p) src[p] = planes[p];
    return Status::Ok();
  }

  Status Convert(const AVFrame* f, int slot) {
    if (static_cast<int64_t>(f->width) * f->height > o.max_pixels)
      return Status::TooLarge(
          fmt::format("frame size {}x{} is over max_pixels {}", f->width, f->height, o.max_pixels));
    const int W = sink ? f->width : o.out_w, H = sink ? f->height : o.out_h;
    const AVPixelFormat format = static_cast<AVPixelFormat>(f->format);
    const uint8_t* src[4] = {f->data[0], f->data[1], f->data[2], f->data[3]};
    const int* src_strides = f->linesize;
    int sw = f->width, sh = f->height;
    if (o.resize == VideoResize::kCover && !sink) CoverCrop(f, W, H, src, &sw, &sh);
    int yuv_strides[4] = {};
    if (o.scale_in == VideoScaleIn::kYuv && (sw != W || sh != H) && PlanarYuv(format)) {
      MMFEED_RETURN_IF_ERROR(ScalePlanes(format, W, H, src, src_strides, sw, sh, yuv_strides));
      src_strides = yuv_strides;
      sw = W;
      sh = H;
    }
    // Always RGB24: swscale's planar-RGB output rounds chroma differently, and RGB24 is what
    // PyAV's to_ndarray(format='rgb24') and OpenCV give, so the pixels match them exactly.
    vs.sws_ = sws_getCachedContext(vs.sws_, sw, sh, format, W, H, AV_PIX_FMT_RGB24, o.sws_flags,
                                   nullptr, nullptr, nullptr);
    if (!vs.sws_)
      return Status::Unsupported(
          fmt::format("cannot convert pixel format {}", av_get_pix_fmt_name(format)));
    uint8_t* base = sink ? nullptr : frames + slot * FrameBytes();
    // THWC uint8: straight into the output, when swscale resizes. Its unscaled YUV-to-RGB24
    // path (same size in and out) writes whole blocks of pixels, up to 24 bytes past a row
    // that ends inside one: that goes to vs.rgb_, which has the room.
    const bool direct = !sink && (sw != W || sh != H) && o.pixels.dtype == DType::kUInt8 &&
                        o.layout == VideoLayout::kTHWC;
    const size_t plane = static_cast<size_t>(H) * W;
    if (!direct) vs.rgb_.resize(plane * 3 + kSwscaleSlack);
    uint8_t* dst[4] = {direct ? base : vs.rgb_.data()};
    int strides[4] = {3 * W};
    sws_scale(vs.sws_, src, src_strides, 0, sh, dst, strides);
    if (sink) {
      rgb_w = W;
      rgb_h = H;
      return (*sink)(slot, vs.rgb_.data(), W, H);
    }
    if (direct) return Status::Ok();
    const bool planar = o.layout != VideoLayout::kTHWC;
    uint8_t* const parts[3] = {planar ? Plane(slot, 0) : base, planar ? Plane(slot, 1) : nullptr,
                               planar ? Plane(slot, 2) : nullptr};
    Rgb24ToOutput(o.pixels, planar, vs.rgb_.data(), plane, parts);
    return Status::Ok();
  }

  Status Resolve(const Target& target, const AVFrame* f, int64_t p, bool damaged) {
    const int slot = target.slot;
    pts_out[slot] = static_cast<float>(Seconds(p));
    mask[slot] = 1;
    ++vs.stats_.sampled;
    if (damaged && damaged_picks++ == 0) first_damaged = Seconds(p);
    if (written_slot >= 0 && written_pts == p) {
      if (sink) return (*sink)(slot, vs.rgb_.data(), rgb_w, rgb_h);
      CopyFrame(slot, written_slot);
      return Status::Ok();
    }
    written_slot = slot;
    written_pts = p;
    return Convert(f, slot);
  }

  // Damage shows in the frame's flags, and carries on to the frames after it until a clean
  // keyframe (they may predict from it).
  bool Damaged(const AVFrame* f) {
    if (f->decode_error_flags || (f->flags & AV_FRAME_FLAG_CORRUPT))
      tainted = true;
    else if (f->key_frame)
      tainted = false;
    return tainted;
  }

  // A frame out of the decoder, in presentation order.
  Status OnFrame(AVFrame* f) {
    ++vs.stats_.decoded;
    int64_t p = FramePts(f);
    if (p == kNoPts) p = have_prev ? prev_pts + frame_dur : start_ts;
    if (first_after_seek) {
      first_after_seek = false;
      if (p > targets[next].ts && cur_key > 0) {  // landed after the target: go one keyframe back
        retry_target = static_cast<int>(next);
        retry_cap = cur_key - 1;
        Seek(cur_key - 1);
        return Status::Ok();
      }
    }
    if (have_prev && p <= prev_pts) return Status::Ok();  // not after the last frame: ignore
    const bool damaged = Damaged(f);
    while (next < targets.size() && targets[next].ts < p) {
      // Before the video's first frame, the first frame is on screen.
      MMFEED_RETURN_IF_ERROR(have_prev ? Resolve(targets[next], prev, prev_pts, prev_damaged)
                                       : Resolve(targets[next], f, p, damaged));
      ++next;
    }
    av_frame_unref(prev);
    av_frame_move_ref(prev, f);
    have_prev = true;
    prev_pts = p;
    prev_damaged = damaged;
    MaybeSeek();
    return Status::Ok();
  }

  Status Receive() {
    while (next < targets.size()) {
      int e = avcodec_receive_frame(codec, frame);
      if (e == AVERROR(EAGAIN) || e == AVERROR_EOF) return Status::Ok();
      if (e < 0) {
        NoteBad(fmt::format("decode error: {}", AvError(e)));
        return Status::Ok();
      }
      Status s = OnFrame(frame);
      av_frame_unref(frame);
      MMFEED_RETURN_IF_ERROR(s);
    }
    return Status::Ok();
  }

  Status Send(AVPacket* p) {
    const double at = p ? Seconds(p->pts != kNoPts ? p->pts : p->dts) : 0.0;  // for messages
    if (p && (p->flags & AV_PKT_FLAG_CORRUPT))
      NoteBad(fmt::format("packet at {:.2f}s is corrupt or cut short", at));
    for (int tries = 0; tries < 100; ++tries) {  // EAGAIN: take frames out, then send again
      int e = avcodec_send_packet(codec, p);
      if (e == AVERROR(EAGAIN)) {
        const int64_t seeks = vs.stats_.seeks;
        MMFEED_RETURN_IF_ERROR(Receive());
        if (next >= targets.size() || vs.stats_.seeks != seeks)
          return Status::Ok();  // done, or p is stale
        continue;
      }
      if (e < 0 && e != AVERROR_EOF)
        NoteBad(fmt::format("undecodable packet at {:.2f}s: {}", at, AvError(e)));
      return Status::Ok();
    }
    NoteBad("the decoder takes no more input");
    return Status::Ok();
  }

  // Targets left when the stream ended: the last frame is on screen, unless the stream ended
  // well before the target (cut, or damaged, or shorter than the container says).
  Status ResolveAtEnd() {
    for (; next < targets.size(); ++next) {
      const Target& t = targets[next];
      if (!have_prev) {
        return bad ? Status::Corrupt("no decodable frames: " + first_bad)
                   : Status::Corrupt("no decodable frames");
      }
      // Allow for the last frame's own duration (a variable-rate video may hold its last frame).
      if (t.ts - prev_pts > 2 * std::max(frame_dur, prev->pkt_duration)) {
        if (bad || end_from_stream)
          return Status::Corrupt(fmt::format("truncated: decodes to {:.2f}s, declares {:.2f}s{}",
                                             Seconds(prev_pts + frame_dur), Seconds(end_ts),
                                             bad ? " (" + first_bad + ")" : ""));
        continue;  // the container's duration covers other streams: padding
      }
      MMFEED_RETURN_IF_ERROR(Resolve(t, prev, prev_pts, prev_damaged));
    }
    return Status::Ok();
  }

  Status DecodeTargets() {
    MaybeSeek();
    while (next < targets.size()) {
      if (lost) return Status::Unsupported("cannot seek back to the start of the video stream");
      FillWindow();
      if (window.empty()) {
        const int64_t seeks = vs.stats_.seeks;
        MMFEED_RETURN_IF_ERROR(Send(nullptr));  // drain the decoder
        MMFEED_RETURN_IF_ERROR(Receive());
        if (vs.stats_.seeks != seeks)
          continue;  // a frame sent us back (a seek landed past its target)
        return ResolveAtEnd();
      }
      AVPacket* p = window.front();
      window.pop_front();
      const bool skip = Skippable(p);
      vs.stats_.skipped += skip;
      codec->skip_frame = skip ? AVDISCARD_NONREF : AVDISCARD_DEFAULT;
      if (p->pts != kNoPts) {
        fed_max = std::max(fed_max, p->pts);
        sent_pts.push_back(p->pts);
        if (sent_pts.size() > kLookahead) sent_pts.pop_front();
      }
      Status s = Send(p);
      av_packet_free(&p);
      MMFEED_RETURN_IF_ERROR(s);
      MMFEED_RETURN_IF_ERROR(Receive());
    }
    return Status::Ok();
  }

  // keyframes: T keyframes spread over the index, each decoded alone after a seek.
  Status DecodeKeyframes() {
    const int K = static_cast<int>(index->key_ts.size());
    if (K == 0) return Status::Corrupt("no keyframes");
    for (int i = 0; i < std::min(K, T); ++i) {
      const int k = K >= T ? static_cast<int>((i + 0.5) * K / T) : i;
      if (i > 0 || k > 0) {  // the first keyframe is where Timeline() left the demuxer
        Seek(k);
        if (!seekable) return Status::Unsupported("keyframes sampling needs a seekable container");
      }
      first_after_seek = false;
      bool got = false;
      while (!got) {
        FillWindow();
        AVPacket* p = nullptr;
        if (!window.empty()) {
          p = window.front();
          window.pop_front();
        }
        int e = avcodec_send_packet(codec, p);
        const bool was_key = p && (p->flags & AV_PKT_FLAG_KEY);
        av_packet_free(&p);
        if (e < 0 && e != AVERROR_EOF && e != AVERROR(EAGAIN))
          NoteBad(fmt::format("decode error: {}", AvError(e)));
        if (was_key || window.empty())
          avcodec_send_packet(codec, nullptr);  // the keyframe is all we need
        while (!got) {
          e = avcodec_receive_frame(codec, frame);
          if (e < 0) break;
          ++vs.stats_.decoded;
          const int64_t pts = FramePts(frame);
          tainted = false;
          Status s = Resolve({0, i}, frame, pts == kNoPts ? KeyPts(k) : pts, Damaged(frame));
          av_frame_unref(frame);
          MMFEED_RETURN_IF_ERROR(s);
          got = true;
        }
        if (!got && e == AVERROR_EOF)
          return Status::Corrupt(fmt::format("keyframe {} does not decode", k));
      }
      avcodec_flush_buffers(codec);
    }
    return Status::Ok();
  }

  // Slots left at mask 0 get the last frame in time (repeat_last) or zeros.
  void Pad() {
    int last = -1;
    for (int i = 0; i < T; ++i)
      if (mask[i] && (last < 0 || pts_out[i] > pts_out[last])) last = i;
    for (int i = 0; i < T; ++i) {
      if (mask[i]) continue;
      if (o.pad == VideoPad::kRepeatLast && last >= 0) {
        CopyFrame(i, last);
        pts_out[i] = pts_out[last];
      } else {
        ZeroFrame(i);
        pts_out[i] = 0;
      }
    }
  }

  VideoFacts Facts() const {
    VideoFacts f;
    f.width = st->codecpar->width;
    f.height = st->codecpar->height;
    const AVRational rate = st->avg_frame_rate.num > 0 ? st->avg_frame_rate : st->r_frame_rate;
    f.fps = rate.num > 0 && rate.den > 0 ? av_q2d(rate) : 0.0;
    f.duration = Seconds(end_ts);
    f.frames = st->nb_frames > 0 ? st->nb_frames : std::llround(f.duration * f.fps);
    return f;
  }

  // Sample: the sampling mode's frames into `frames`, padded. SampleFrames: `plan`'s frames to
  // the sink, not padded.
  Status Go(const FieldValue& in, Rng* rng, const FramePlan* plan = nullptr) {
    if (!plan) std::memset(mask, 0, T);
    MMFEED_RETURN_IF_ERROR(Open(in));
    MMFEED_RETURN_IF_ERROR(Timeline());
    if (o.sampling == VideoSampling::kKeyframes && !plan) {
      MMFEED_RETURN_IF_ERROR(DecodeKeyframes());
    } else {
      if (end_ts == kNoPts || end_ts <= start_ts)
        return Status::Corrupt("zero-length video (duration 0)");
      if (plan) {
        MMFEED_ASSIGN_OR_RETURN(std::vector<double> times, (*plan)(Facts()));
        if (times.empty() || times.size() > kMaxPlannedFrames)
          return Status::Invalid(
              fmt::format("{} frames planned, outside 1..{}", times.size(), kMaxPlannedFrames));
        T = static_cast<int>(times.size());
        sink_pts.assign(T, 0.0f);
        pts_out = sink_pts.data();
        std::memset(mask, 0, T);
        MMFEED_RETURN_IF_ERROR(SetTargets(times));
      } else {
        MMFEED_RETURN_IF_ERROR(MakeTargets(rng));
      }
      MMFEED_RETURN_IF_ERROR(DecodeTargets());
    }
    if (damaged_picks)
      return Status::Corrupt(fmt::format("{} sampled frame(s) damaged, first at {:.2f}s{}",
                                         damaged_picks, first_damaged,
                                         bad ? ": " + first_bad : ""));
    if (!plan) Pad();
    ++vs.stats_.videos;
    return Status::Ok();
  }
};

Status VideoSampler::Sample(const FieldValue& in, Rng* rng, uint8_t* frames, float* pts,
                            uint8_t* mask) {
  Run run(*this, frames, pts, mask);
  return run.Go(in, rng);
}

Result<VideoFacts> VideoSampler::Probe(const FieldValue& in) {
  uint8_t mask = 0;
  Run run(*this, nullptr, nullptr, &mask);
  MMFEED_RETURN_IF_ERROR(run.Open(in));
  MMFEED_RETURN_IF_ERROR(run.Timeline());
  if (run.end_ts == kNoPts || run.end_ts <= run.start_ts)
    return Status::Corrupt("zero-length video (duration 0)");
  return run.Facts();
}

Status VideoSampler::SampleFrames(const FieldValue& in, const FramePlan& plan,
                                  const FrameSink& sink, std::vector<uint8_t>* mask) {
  mask->assign(kMaxPlannedFrames, 0);
  Run run(*this, nullptr, nullptr, mask->data());
  run.sink = &sink;
  Status s = run.Go(in, nullptr, &plan);
  mask->resize(run.T);
  return s;
}

}  // namespace mmfeed
