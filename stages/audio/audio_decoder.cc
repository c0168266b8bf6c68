#include "stages/audio/audio_decoder.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <memory>

extern "C" {
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/opt.h>
#include <libswresample/swresample.h>
}

namespace mmfeed {
namespace {

std::string AvError(int err) {
  char buf[AV_ERROR_MAX_STRING_SIZE] = {};
  av_strerror(err, buf, sizeof(buf));
  return buf;
}

// Reads from an in-memory buffer for AVIOContext.
struct MemoryReader {
  std::string_view data;
  int64_t pos = 0;

  static int Read(void* opaque, uint8_t* buf, int size) {
    auto* r = static_cast<MemoryReader*>(opaque);
    int64_t left = static_cast<int64_t>(r->data.size()) - r->pos;
    if (left <= 0) return AVERROR_EOF;
    int n = static_cast<int>(std::min<int64_t>(left, size));
    std::memcpy(buf, r->data.data() + r->pos, n);
    r->pos += n;
    return n;
  }

  static int64_t Seek(void* opaque, int64_t offset, int whence) {
    auto* r = static_cast<MemoryReader*>(opaque);
    int64_t size = static_cast<int64_t>(r->data.size());
    if (whence == AVSEEK_SIZE) return size;
    int64_t base = (whence & ~AVSEEK_FORCE) == SEEK_CUR ? r->pos : (whence & ~AVSEEK_FORCE) == SEEK_END ? size : 0;
    int64_t target = base + offset;
    if (target < 0 || target > size) return AVERROR(EINVAL);
    r->pos = target;
    return target;
  }
};

// Owns every FFmpeg object of one decode; frees them in the right order whatever happens.
struct Session {
  MemoryReader reader;
  AVIOContext* io = nullptr;
  AVFormatContext* fmt = nullptr;
  AVCodecContext* codec = nullptr;
  SwrContext* swr = nullptr;
  AVPacket* packet = nullptr;
  AVFrame* frame = nullptr;

  ~Session() {
    av_frame_free(&frame);
    av_packet_free(&packet);
    swr_free(&swr);
    avcodec_free_context(&codec);
    avformat_close_input(&fmt);  // frees fmt; io is ours
    if (io) av_freep(&io->buffer);
    avio_context_free(&io);
  }
};

constexpr int kIoBufferBytes = 64 * 1024;

// A WAV names its sample bytes in the "data" chunk; FFmpeg quietly plays a cut file shorter.
// Returns an error if the file holds fewer bytes than declared.
Status CheckWavLength(std::string_view b) {
  if (b.size() < 12 || b.substr(0, 4) != "RIFF" || b.substr(8, 4) != "WAVE") return Status::Ok();
  size_t pos = 12;
  while (pos + 8 <= b.size()) {
    uint32_t size;
    std::memcpy(&size, b.data() + pos + 4, 4);
    if (b.substr(pos, 4) == "data") {
      uint64_t have = b.size() - (pos + 8);
      if (size != 0xFFFFFFFFu && size > have)  // 0xFFFFFFFF: length unknown (streamed)
        return Status::Corrupt(fmt::format("truncated: WAV declares {} bytes of samples, file has {}", size, have));
      return Status::Ok();
    }
    pos += 8 + size + (size & 1);
  }
  return Status::Ok();
}

}  // namespace

Status DecodeAudio(std::string_view bytes, int sample_rate, const AudioLimits& limits, std::vector<float>* out) {
  out->clear();
  if (bytes.empty()) return Status::Corrupt("empty file (0 bytes)");
  MMFEED_RETURN_IF_ERROR(CheckWavLength(bytes));
  Session s;
  s.reader.data = bytes;
  auto* buffer = static_cast<uint8_t*>(av_malloc(kIoBufferBytes));
  s.io = avio_alloc_context(buffer, kIoBufferBytes, 0, &s.reader, &MemoryReader::Read, nullptr, &MemoryReader::Seek);
  if (!s.io) {
    av_free(buffer);
    return Status::Io("out of memory (AVIOContext)");
  }
  s.fmt = avformat_alloc_context();
  s.fmt->pb = s.io;
  s.fmt->flags |= AVFMT_FLAG_CUSTOM_IO;
  s.fmt->probesize = 64 * 1024;  // enough to recognise any container; the default reads 5 MB
  int err = avformat_open_input(&s.fmt, nullptr, nullptr, nullptr);
  if (err < 0) return Status::Corrupt(fmt::format("not a readable audio file: {}", AvError(err)));
  // Reading stream info decodes packets ahead; skip it when the headers already say enough
  // (WAV, FLAC, Ogg, MP4 do; a bare MP3 stream may not).
  bool known = s.fmt->nb_streams > 0;
  for (unsigned i = 0; i < s.fmt->nb_streams; ++i) {
    const AVCodecParameters* p = s.fmt->streams[i]->codecpar;
    known = known && p->codec_id != AV_CODEC_ID_NONE &&
            (p->codec_type != AVMEDIA_TYPE_AUDIO || (p->sample_rate > 0 && p->ch_layout.nb_channels > 0));
  }
  if (!known && (err = avformat_find_stream_info(s.fmt, nullptr)) < 0)
    return Status::Corrupt(fmt::format("cannot read stream info: {}", AvError(err)));
  const AVCodec* decoder = nullptr;
  int index = av_find_best_stream(s.fmt, AVMEDIA_TYPE_AUDIO, -1, -1, &decoder, 0);
  if (index < 0 || !decoder) return Status::Corrupt("no audio stream (or no decoder for it)");
  AVStream* stream = s.fmt->streams[index];
  const AVCodecParameters* par = stream->codecpar;
  if (par->ch_layout.nb_channels <= 0 || par->ch_layout.nb_channels > limits.max_channels)
    return Status::TooLarge(fmt::format("{} channels (limit {})", par->ch_layout.nb_channels, limits.max_channels));
  if (par->sample_rate <= 0 || par->sample_rate > limits.max_sample_rate)
    return Status::TooLarge(fmt::format("sample rate {} Hz (limit {})", par->sample_rate, limits.max_sample_rate));
  s.codec = avcodec_alloc_context3(decoder);
  avcodec_parameters_to_context(s.codec, par);
  s.codec->thread_count = 1;  // the stage's workers are the parallelism
  err = avcodec_open2(s.codec, decoder, nullptr);
  if (err < 0) return Status::Unsupported(fmt::format("cannot open {} decoder: {}", decoder->name, AvError(err)));

  AVChannelLayout mono = AV_CHANNEL_LAYOUT_MONO;
  s.packet = av_packet_alloc();
  s.frame = av_frame_alloc();
  const int64_t max_samples = static_cast<int64_t>(limits.max_seconds * sample_rate);
  int bad_packets = 0;
  std::string first_bad;

  auto convert = [&](const AVFrame* f) -> Status {
    if (!s.swr) {
      if (f->ch_layout.nb_channels <= 0 || f->ch_layout.nb_channels > limits.max_channels)
        return Status::TooLarge(fmt::format("{} channels (limit {})", f->ch_layout.nb_channels, limits.max_channels));
      if (f->sample_rate <= 0 || f->sample_rate > limits.max_sample_rate)
        return Status::TooLarge(fmt::format("sample rate {} Hz (limit {})", f->sample_rate, limits.max_sample_rate));
      int e = swr_alloc_set_opts2(&s.swr, &mono, AV_SAMPLE_FMT_FLT, sample_rate, const_cast<AVChannelLayout*>(&f->ch_layout),
                                  static_cast<AVSampleFormat>(f->format), f->sample_rate, 0, nullptr);
      if (e < 0 || (e = swr_init(s.swr)) < 0) return Status::Unsupported(fmt::format("resampler: {}", AvError(e)));
    }
    int64_t room = f ? swr_get_out_samples(s.swr, f->nb_samples) : swr_get_out_samples(s.swr, 0);
    if (room <= 0) return Status::Ok();
    size_t old = out->size();
    out->resize(old + room);
    uint8_t* dst = reinterpret_cast<uint8_t*>(out->data() + old);
    int n = swr_convert(s.swr, &dst, static_cast<int>(room), f ? const_cast<const uint8_t**>(f->extended_data) : nullptr,
                        f ? f->nb_samples : 0);
    if (n < 0) return Status::Corrupt(fmt::format("resampling failed: {}", AvError(n)));
    out->resize(old + n);
    if (static_cast<int64_t>(out->size()) > max_samples)
      return Status::TooLarge(fmt::format("longer than max_file_seconds {}", limits.max_seconds));
    return Status::Ok();
  };

  auto drain = [&]() -> Status {
    while (true) {
      int e = avcodec_receive_frame(s.codec, s.frame);
      if (e == AVERROR(EAGAIN) || e == AVERROR_EOF) return Status::Ok();
      if (e < 0) {
        if (bad_packets++ == 0) first_bad = AvError(e);
        return Status::Ok();
      }
      Status st = convert(s.frame);
      av_frame_unref(s.frame);
      if (!st.ok()) return st;
    }
  };

  while (true) {
    err = av_read_frame(s.fmt, s.packet);
    if (err == AVERROR_EOF) break;
    if (err < 0) {
      if (bad_packets++ == 0) first_bad = AvError(err);
      break;
    }
    if (s.packet->stream_index == index) {
      if (s.packet->flags & AV_PKT_FLAG_CORRUPT) {  // e.g. the last packet of a cut file
        if (bad_packets++ == 0) first_bad = fmt::format("packet at {:.2f}s is corrupt or cut short", s.packet->pts * av_q2d(stream->time_base));
      }
      int e = avcodec_send_packet(s.codec, s.packet);
      if (e < 0 && bad_packets++ == 0) first_bad = AvError(e);
      MMFEED_RETURN_IF_ERROR(drain());
    }
    av_packet_unref(s.packet);
  }
  avcodec_send_packet(s.codec, nullptr);
  MMFEED_RETURN_IF_ERROR(drain());
  if (s.swr) MMFEED_RETURN_IF_ERROR(convert(nullptr));  // flush the resampler's delay

  if (bad_packets) return Status::Corrupt(fmt::format("{} undecodable packet(s), first: {}", bad_packets, first_bad));
  if (out->empty()) return Status::Corrupt("no audio samples");
  // A container that declares its length (WAV, FLAC, MP4) but ends early was cut.
  if (s.fmt->duration_estimation_method != AVFMT_DURATION_FROM_BITRATE && stream->duration > 0) {
    double declared = stream->duration * av_q2d(stream->time_base);
    double got = static_cast<double>(out->size()) / sample_rate;
    if (got < declared * 0.9 && declared - got > 0.05)
      return Status::Corrupt(fmt::format("truncated: declares {:.2f}s, decodes to {:.2f}s", declared, got));
  }
  for (float v : *out)
    if (!std::isfinite(v)) return Status::Corrupt("decodes to NaN or infinite samples");
  return Status::Ok();
}

}  // namespace mmfeed
