#include "stages/audio/audio_decoder.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>

extern "C" {
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/opt.h>
#include <libswresample/swresample.h>
}

#include "stages/ffmpeg/av_input.h"

namespace mmfeed {
namespace {

// Owns every FFmpeg object of one decode; frees them in the right order whatever happens.
struct Session {
  AvInput input;
  AVCodecContext* codec = nullptr;
  SwrContext* swr = nullptr;
  AVPacket* packet = nullptr;
  AVFrame* frame = nullptr;

  ~Session() {
    av_frame_free(&frame);
    av_packet_free(&packet);
    swr_free(&swr);
    avcodec_free_context(&codec);
  }
};

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
        return Status::Corrupt(
            fmt::format("truncated: WAV declares {} bytes of samples, file has {}", size, have));
      return Status::Ok();
    }
    pos += 8 + size + (size & 1);
  }
  return Status::Ok();
}

}  // namespace

Status DecodeAudio(std::string_view bytes, int sample_rate, const AudioLimits& limits,
                   std::vector<float>* out) {
  out->clear();
  MMFEED_RETURN_IF_ERROR(CheckWavLength(bytes));
  Session s;
  // 64 KB of probing recognises any container; FFmpeg's default reads 5 MB. The codec the
  // container names is the codec (no probing of PCM packets for another one).
  MMFEED_RETURN_IF_ERROR(s.input.OpenBytes(bytes, "audio", 64 * 1024, /*probe_packets=*/false));
  AVFormatContext* const container = s.input.fmt();
  int err = 0;
  // Reading stream info decodes packets ahead; skip it when the headers already say enough
  // (WAV, FLAC, Ogg, MP4 do; a bare MP3 stream may not).
  bool known = container->nb_streams > 0;
  for (unsigned i = 0; i < container->nb_streams; ++i) {
    const AVCodecParameters* p = container->streams[i]->codecpar;
    known = known && p->codec_id != AV_CODEC_ID_NONE &&
            (p->codec_type != AVMEDIA_TYPE_AUDIO ||
             (p->sample_rate > 0 && p->ch_layout.nb_channels > 0));
  }
  if (!known && (err = avformat_find_stream_info(container, nullptr)) < 0)
    return Status::Corrupt(fmt::format("cannot read stream info: {}", AvError(err)));
  const AVCodec* decoder = nullptr;
  int index = av_find_best_stream(container, AVMEDIA_TYPE_AUDIO, -1, -1, &decoder, 0);
  if (index < 0 || !decoder) return Status::Corrupt("no audio stream (or no decoder for it)");
  AVStream* stream = container->streams[index];
  const AVCodecParameters* par = stream->codecpar;
  if (par->ch_layout.nb_channels <= 0 || par->ch_layout.nb_channels > limits.max_channels)
    return Status::TooLarge(
        fmt::format("{} channels (limit {})", par->ch_layout.nb_channels, limits.max_channels));
  if (par->sample_rate <= 0 || par->sample_rate > limits.max_sample_rate)
    return Status::TooLarge(
        fmt::format("sample rate {} Hz (limit {})", par->sample_rate, limits.max_sample_rate));
  s.codec = avcodec_alloc_context3(decoder);
  avcodec_parameters_to_context(s.codec, par);
  s.codec->thread_count = 1;  // the stage's workers are the parallelism
  err = avcodec_open2(s.codec, decoder, nullptr);
  if (err < 0)
    return Status::Unsupported(
        fmt::format("cannot open {} decoder: {}", decoder->name, AvError(err)));

  AVChannelLayout mono = AV_CHANNEL_LAYOUT_MONO;
  s.packet = av_packet_alloc();
  s.frame = av_frame_alloc();
  const int64_t max_samples = static_cast<int64_t>(limits.max_seconds * sample_rate);
  int bad_packets = 0;
  std::string first_bad;

  auto convert = [&](const AVFrame* f) -> Status {
    if (!s.swr) {
      if (f->ch_layout.nb_channels <= 0 || f->ch_layout.nb_channels > limits.max_channels)
        return Status::TooLarge(
            fmt::format("{} channels (limit {})", f->ch_layout.nb_channels, limits.max_channels));
      if (f->sample_rate <= 0 || f->sample_rate > limits.max_sample_rate)
        return Status::TooLarge(
            fmt::format("sample rate {} Hz (limit {})", f->sample_rate, limits.max_sample_rate));
      int e =
          swr_alloc_set_opts2(&s.swr, &mono, AV_SAMPLE_FMT_FLT, sample_rate,
                              const_cast<AVChannelLayout*>(&f->ch_layout),
                              static_cast<AVSampleFormat>(f->format), f->sample_rate, 0, nullptr);
      // libswresample interpolates between two of its filter's phases by default. When the
      // rates' ratio needs at most its 1 << phase_shift phases (exact_rational, also a default),
      // every output sample falls on a phase and that interpolation only adds work: off there,
      // the same output bits (AudioStageTest.ResamplingEqualsLibswresamplesDefaults).
      int64_t phase_shift = 0, exact_rational = 0;
      if (e >= 0 && av_opt_get_int(s.swr, "phase_shift", 0, &phase_shift) >= 0 &&
          av_opt_get_int(s.swr, "exact_rational", 0, &exact_rational) >= 0 && exact_rational &&
          sample_rate / std::gcd(f->sample_rate, sample_rate) <= (int64_t{1} << phase_shift))
        e = av_opt_set_int(s.swr, "linear_interp", 0, 0);
      if (e < 0 || (e = swr_init(s.swr)) < 0)
        return Status::Unsupported(fmt::format("resampler: {}", AvError(e)));
    }
    int64_t room = f ? swr_get_out_samples(s.swr, f->nb_samples) : swr_get_out_samples(s.swr, 0);
    if (room <= 0) return Status::Ok();
    size_t old = out->size();
    out->resize(old + room);
    uint8_t* dst = reinterpret_cast<uint8_t*>(out->data() + old);
    int n = swr_convert(s.swr, &dst, static_cast<int>(room),
                        f ? const_cast<const uint8_t**>(f->extended_data) : nullptr,
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
    if (SampleDeadlinePassed())
      return Status::Timeout("the sample's time limit ran out while decoding");
    err = av_read_frame(container, s.packet);
    if (err == AVERROR_EOF) break;
    if (err < 0) {
      if (bad_packets++ == 0) first_bad = AvError(err);
      break;
    }
    if (s.packet->stream_index == index) {
      if (s.packet->flags & AV_PKT_FLAG_CORRUPT) {  // e.g. the last packet of a cut file
        if (bad_packets++ == 0)
          first_bad = fmt::format("packet at {:.2f}s is corrupt or cut short",
                                  s.packet->pts * av_q2d(stream->time_base));
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

  if (bad_packets)
    return Status::Corrupt(
        fmt::format("{} undecodable packet(s), first: {}", bad_packets, first_bad));
  if (out->empty()) return Status::Corrupt("no audio samples");
  // A container that declares its length (WAV, FLAC, MP4) but ends early was cut.
  if (container->duration_estimation_method != AVFMT_DURATION_FROM_BITRATE &&
      stream->duration > 0) {
    double declared = stream->duration * av_q2d(stream->time_base);
    double got = static_cast<double>(out->size()) / sample_rate;
    if (got < declared * 0.9 && declared - got > 0.05)
      return Status::Corrupt(
          fmt::format("truncated: declares {:.2f}s, decodes to {:.2f}s", declared, got));
  }
  for (float v : *out)
    if (!std::isfinite(v)) return Status::Corrupt("decodes to NaN or infinite samples");
  return Status::Ok();
}

}  // namespace mmfeed
