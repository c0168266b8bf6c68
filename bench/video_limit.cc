// mmfeed-bench-video-limit: the least work any exact video loader must do for a set of clips
// (issue #34): demux and decode, with the same FFmpeg decoder and threads as the video stage,
// the frames the picks need and nothing else, then drop them (no conversion, no copy).
//
//   mmfeed-bench-video-limit [--workers N] [--threads T] CLIPS.jsonl
//
// CLIPS.jsonl: mmfeed-video's per-file lines ({"path", "pts", "mask"}: the picks, in seconds
// from the stream's start). For each clip the picks are grouped by the keyframe before them
// (the container's index); each group is one seek to its keyframe, then packets in order until
// its last pick is out, the packets of frames not picked sent with skip_frame = nonref (the
// decoder skips the frames nothing refers to; reference frames must be decoded, as every
// later frame of the group may predict from them). Clips run on N worker threads, as
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

// Decodes what `c` needs; adds its work to `w`.
void DecodeClip(const Clip& c, int threads, Work* w) {
  AVFormatContext* fmt = nullptr;
  if (avformat_open_input(&fmt, c.path.c_str(), nullptr, nullptr) < 0)
    Fail("cannot open " + c.path);
  const AVCodec* dec = nullptr;
  const int si = av_find_best_stream(fmt, AVMEDIA_TYPE_VIDEO, -1, -1, &dec, 0);
  if (si < 0 || !dec) Fail("no video stream in " + c.path);
  for (unsigned i = 0; i < fmt->nb_streams; ++i)
    if (static_cast<int>(i) != si) fmt->streams[i]->discard = AVDISCARD_ALL;
  AVStream* st = fmt->streams[si];
  AVCodecContext* ctx = avcodec_alloc_context3(dec);
  avcodec_parameters_to_context(ctx, st->codecpar);
  ctx->thread_count = threads;
  ctx->thread_type = FF_THREAD_FRAME | FF_THREAD_SLICE;
  ctx->pkt_timebase = st->time_base;
  if (avcodec_open2(ctx, dec, nullptr) < 0) Fail("cannot open the decoder of " + c.path);
  const double tb = av_q2d(st->time_base);
  const int64_t start = st->start_time != AV_NOPTS_VALUE ? st->start_time : 0;
  std::vector<int64_t> picks, keys;
  for (double t : c.picks) picks.push_back(start + std::llround(t / tb));
  const int64_t tolerance = std::max<int64_t>(1, std::llround(1e-3 / tb));
  auto picked = [&](int64_t pts) {
    auto it = std::lower_bound(picks.begin(), picks.end(), pts - tolerance);
    return it != picks.end() && *it <= pts + tolerance;
  };
  for (int i = 0; i < avformat_index_get_entries_count(st); ++i)
    if (const AVIndexEntry* e = avformat_index_get_entry(st, i); e->flags & AVINDEX_KEYFRAME)
      keys.push_back(e->timestamp);
  std::sort(keys.begin(), keys.end());
  auto key_of = [&](int64_t pts) {  // the keyframe before pts (INT64_MIN: no index)
    auto it = std::upper_bound(keys.begin(), keys.end(), pts);
    return it == keys.begin() ? INT64_MIN : *std::prev(it);
  };
  AVPacket* pkt = av_packet_alloc();
  AVFrame* frame = av_frame_alloc();
  size_t next = 0;  // the first pick not out yet
  while (next < picks.size()) {
    // One group: the picks after the same keyframe.
    const int64_t key = key_of(picks[next]);
    size_t end = next;
    while (end < picks.size() && key_of(picks[end]) == key) ++end;
    if (av_seek_frame(fmt, si, picks[next], AVSEEK_FLAG_BACKWARD) < 0)
      Fail("cannot seek " + c.path);
    avcodec_flush_buffers(ctx);
    ++w->seeks;
    size_t out = 0;  // picks of the group out
    bool eof = false;
    while (out < end - next) {
      if (!eof) {
        const int r = av_read_frame(fmt, pkt);
        if (r < 0) {
          eof = true;
          avcodec_send_packet(ctx, nullptr);
        } else {
          if (pkt->stream_index == si) {
            ctx->skip_frame = picked(pkt->pts) ? AVDISCARD_DEFAULT : AVDISCARD_NONREF;
            avcodec_send_packet(ctx, pkt);
          }
          av_packet_unref(pkt);
        }
      }
      int r;
      while ((r = avcodec_receive_frame(ctx, frame)) == 0) {
        ++w->decoded;
        const int64_t pts = frame->best_effort_timestamp;
        if (pts >= picks[next] - tolerance && pts <= picks[end - 1] + tolerance && picked(pts))
          ++out;
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
  avcodec_free_context(&ctx);
  avformat_close_input(&fmt);
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
  std::vector<Work> work(workers);
  std::atomic<size_t> next{0};
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (int k = 0; k < workers; ++k)
    pool.emplace_back([&, k] {
      for (size_t i; (i = next++) < clips.size();) DecodeClip(clips[i], threads, &work[k]);
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
