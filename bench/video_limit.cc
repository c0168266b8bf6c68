// mmfeed-bench-video-limit: the least work any exact video loader must do for a set of clips
// (issue #34): demux and decode, with the same FFmpeg decoder and threads as the video stage,
// the frames the picks need and nothing else, then drop them (no conversion, no copy).
//
//   mmfeed-bench-video-limit [--workers N] [--threads T] CLIPS.jsonl
//
// CLIPS.jsonl: mmfeed-video's per-file lines ({"path", "pts", "mask"}: the picks, in seconds
// from the stream's start). For each clip the picks are grouped by the keyframe before them
// (from an untimed demux pass over each file); each group is one seek to its keyframe, then
// packets in decode order until its last pick is sent, then the decoder is drained; the packets
// of frames not picked are sent with skip_frame = nonref (the decoder skips the frames nothing
// refers to; reference frames must be decoded, as later frames of the group may predict from
// them). Clips run on N worker threads, as
// mmfeed-video --bench runs the stage, each file opened per clip (as the stage does).
// Prints one JSON line: clips/s, frames decoded per picked frame, seeks per clip.
extern "C" {
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
}

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

namespace {

struct Clip {
  std::string path;
  std::vector<double> picks;  // seconds from the stream's start, ascending, distinct
};

struct Work {
  long clips = 0, decoded = 0, picked = 0, seeks = 0;
};

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "mmfeed-bench-video-limit: %s\n", what.c_str());
  std::exit(1);
}

// The file opened with its video stream's decoder (one per clip, as the stage opens them;
// `threads` -1: demuxed only, no decoder).
struct Input {
  AVFormatContext* fmt = nullptr;
  AVCodecContext* ctx = nullptr;
  int si = -1;
  Input(const std::string& path, int threads) {
    if (avformat_open_input(&fmt, path.c_str(), nullptr, nullptr) < 0) Fail("cannot open " + path);
    const AVCodec* dec = nullptr;
    si = av_find_best_stream(fmt, AVMEDIA_TYPE_VIDEO, -1, -1, &dec, 0);
    if (si < 0 || !dec) Fail("no video stream in " + path);
    for (unsigned i = 0; i < fmt->nb_streams; ++i)
      if (static_cast<int>(i) != si) fmt->streams[i]->discard = AVDISCARD_ALL;
    if (threads < 0) return;
    ctx = avcodec_alloc_context3(dec);
    avcodec_parameters_to_context(ctx, fmt->streams[si]->codecpar);
    ctx->thread_count = threads;
    ctx->thread_type = FF_THREAD_FRAME | FF_THREAD_SLICE;
    ctx->pkt_timebase = fmt->streams[si]->time_base;
    if (avcodec_open2(ctx, dec, nullptr) < 0) Fail("cannot open the decoder of " + path);
  }
  ~Input() {
    avcodec_free_context(&ctx);
    avformat_close_input(&fmt);
  }
  const AVStream* stream() const { return fmt->streams[si]; }
};

// The keyframes' presentation times of `path`'s video stream, by a demux pass (not timed: an
// index the loader may keep, as the stage's keyframe index cache does; a container's own index
// may hold decode times, which differ from them with B-frames).
std::vector<int64_t> KeyframePts(const std::string& path) {
  Input in(path, -1);
  std::vector<int64_t> keys;
  AVPacket* pkt = av_packet_alloc();
  while (av_read_frame(in.fmt, pkt) >= 0) {
    if (pkt->stream_index == in.si && (pkt->flags & AV_PKT_FLAG_KEY) && pkt->pts != AV_NOPTS_VALUE)
      keys.push_back(pkt->pts);
    av_packet_unref(pkt);
  }
  av_packet_free(&pkt);
  std::sort(keys.begin(), keys.end());
  if (keys.empty()) Fail(path + ": no keyframe with a timestamp");
  return keys;
}

// Decodes what `c` needs (`keys`: KeyframePts); adds its work to `w`.
void DecodeClip(const Clip& c, const std::vector<int64_t>& keys, int threads, Work* w) {
  Input in(c.path, threads);
  const double tb = av_q2d(in.stream()->time_base);
  const int64_t start =
      in.stream()->start_time != AV_NOPTS_VALUE ? in.stream()->start_time : keys.front();
  std::vector<int64_t> picks;
  for (double t : c.picks) picks.push_back(start + std::llround(t / tb));
  const int64_t tolerance = std::max<int64_t>(1, std::llround(1e-3 / tb));
  auto picked = [&](int64_t pts) {
    auto it = std::lower_bound(picks.begin(), picks.end(), pts - tolerance);
    return it != picks.end() && *it <= pts + tolerance;
  };
  auto key_of = [&](int64_t pts) {  // the last keyframe at or before pts
    auto it = std::upper_bound(keys.begin(), keys.end(), pts + tolerance);
    return it == keys.begin() ? keys.front() : *std::prev(it);
  };
  AVPacket* pkt = av_packet_alloc();
  AVFrame* frame = av_frame_alloc();
  for (size_t next = 0; next < picks.size();) {
    // One group: the picks after the same keyframe, decoded from it after a seek.
    const int64_t key = key_of(picks[next]);
    size_t end = next;
    while (end < picks.size() && key_of(picks[end]) == key) ++end;
    if (av_seek_frame(in.fmt, in.si, key, AVSEEK_FLAG_BACKWARD) < 0) Fail("cannot seek " + c.path);
    avcodec_flush_buffers(in.ctx);
    ++w->seeks;
    size_t out = 0, sent = 0;  // picks of the group out, and sent to the decoder
    bool started = false, eof = false;
    while (out < end - next) {
      if (!eof) {
        if (av_read_frame(in.fmt, pkt) < 0) {
          if (!started) Fail(c.path + ": the seek passed the keyframe");
          eof = true;
          avcodec_send_packet(in.ctx, nullptr);
        } else {
          // The packets before the group's keyframe (where a seek by decode time landed) are
          // not sent.
          if (pkt->stream_index == in.si &&
              (started |= (pkt->flags & AV_PKT_FLAG_KEY) && pkt->pts == key)) {
            const bool pick = picked(pkt->pts);
            sent += pick;
            in.ctx->skip_frame = pick ? AVDISCARD_DEFAULT : AVDISCARD_NONREF;
            avcodec_send_packet(in.ctx, pkt);
          }
          av_packet_unref(pkt);
          // Every pick of the group sent: drain the decoder rather than decode past them.
          if (sent == end - next) {
            eof = true;
            avcodec_send_packet(in.ctx, nullptr);
          }
        }
      }
      int r;
      while ((r = avcodec_receive_frame(in.ctx, frame)) == 0) {
        // Counted as the stage counts: the frames out until the group's last pick is.
        if (out < end - next) {
          ++w->decoded;
          out += picked(frame->best_effort_timestamp);
        }
        av_frame_unref(frame);
      }
      if (eof && r == AVERROR_EOF) break;  // a pick past the last frame: the stage pads it
    }
    w->picked += static_cast<long>(end - next);
    next = end;
  }
  ++w->clips;
  av_frame_free(&frame);
  av_packet_free(&pkt);
}

}  // namespace

int main(int argc, char** argv) {
  int workers = 2, threads = 1;
  std::string list;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--workers" && i + 1 < argc)
      workers = std::stoi(argv[++i]);
    else if (a == "--threads" && i + 1 < argc)
      threads = std::stoi(argv[++i]);
    else
      list = a;
  }
  if (list.empty() || workers < 1 || threads < 0) {
    std::fprintf(stderr,
                 "usage: mmfeed-bench-video-limit [--workers N] [--threads T] CLIPS.jsonl\n");
    return 2;
  }
  std::vector<Clip> clips;
  std::ifstream in(list);
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (!j.value("ok", false)) Fail("a clip mmfeed-video could not sample: " + line);
    Clip c{j["path"].get<std::string>(), {}};
    const auto pts = j["pts"].get<std::vector<double>>();
    const auto mask = j["mask"].get<std::vector<int>>();
    for (size_t k = 0; k < pts.size(); ++k)
      if (mask[k]) c.picks.push_back(pts[k]);
    std::sort(c.picks.begin(), c.picks.end());
    c.picks.erase(std::unique(c.picks.begin(), c.picks.end()), c.picks.end());
    clips.push_back(std::move(c));
  }
  if (clips.empty()) Fail(list + ": no clips");
  std::map<std::string, std::vector<int64_t>> keys;
  for (const Clip& c : clips)
    if (!keys.count(c.path)) keys[c.path] = KeyframePts(c.path);
  std::vector<Work> work(workers);
  std::atomic<size_t> next{0};
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (int k = 0; k < workers; ++k)
    pool.emplace_back([&, k] {
      for (size_t i; (i = next++) < clips.size();)
        DecodeClip(clips[i], keys.at(clips[i].path), threads, &work[k]);
    });
  for (auto& t : pool) t.join();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  Work sum;
  for (const Work& w : work) {
    sum.clips += w.clips;
    sum.decoded += w.decoded;
    sum.picked += w.picked;
    sum.seeks += w.seeks;
  }
  std::cout << nlohmann::json{{"clips", sum.clips},
                              {"seconds", secs},
                              {"clips_per_s", sum.clips / secs},
                              {"decoded_per_sampled", double(sum.decoded) / double(sum.picked)},
                              {"seeks_per_clip", double(sum.seeks) / double(sum.clips)}}
                   .dump()
            << std::endl;
  return 0;
}
