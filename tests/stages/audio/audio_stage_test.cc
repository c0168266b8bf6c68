#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

extern "C" {
#include <libavutil/channel_layout.h>
#include <libswresample/swresample.h>
}

#include "base/simd.h"
#include "stages/audio/audio_decoder.h"
#include "stages/audio/log_mel.h"
#include "stages/audio/power_spectrum.h"
#include "tests/stage_util.h"
#include "tests/test_util.h"

namespace mmfeed {
namespace {

using testing::MakeStage;
using testing::Output;
using testing::PathField;
using testing::TestData;

// Reads a little-endian float32 .npy (as written by numpy.save) with its shape.
std::vector<float> LoadNpy(const std::string& path, std::vector<int64_t>* shape) {
  std::string d = testing::ReadFile(path);
  uint16_t header_len;
  std::memcpy(&header_len, d.data() + 8, 2);
  std::string header = d.substr(10, header_len);
  EXPECT_NE(header.find("'<f4'"), std::string::npos) << header;
  size_t open = header.find("'shape': (") + 10;
  std::string dims = header.substr(open, header.find(')', open) - open);
  shape->clear();
  for (size_t p = 0; p < dims.size();) {
    shape->push_back(std::stoll(dims.substr(p)));
    p = dims.find(',', p);
    if (p == std::string::npos) break;
    while (p < dims.size() && (dims[p] == ',' || dims[p] == ' ')) ++p;
  }
  std::vector<float> v((d.size() - 10 - header_len) / 4);
  std::memcpy(v.data(), d.data() + 10 + header_len, v.size() * 4);
  return v;
}

std::string FloatWav(const std::vector<float>& x, int rate, int channels = 1) {
  std::string fmt(16, '\0'), out;
  auto put16 = [](std::string& s, size_t at, uint16_t v) { std::memcpy(&s[at], &v, 2); };
  auto put32 = [](std::string& s, size_t at, uint32_t v) { std::memcpy(&s[at], &v, 4); };
  put16(fmt, 0, 3);
  put16(fmt, 2, static_cast<uint16_t>(channels));
  put32(fmt, 4, static_cast<uint32_t>(rate));
  put32(fmt, 8, static_cast<uint32_t>(rate * 4 * channels));
  put16(fmt, 12, static_cast<uint16_t>(4 * channels));
  put16(fmt, 14, 32);
  std::string data(reinterpret_cast<const char*>(x.data()), x.size() * 4);
  out = "RIFF    WAVEfmt ";
  put32(out, 4, static_cast<uint32_t>(4 + 8 + 16 + 8 + data.size()));
  out += std::string(4, '\0');
  put32(out, 16, 16);
  out += fmt + "data" + std::string(4, '\0');
  put32(out, out.size() - 4, static_cast<uint32_t>(data.size()));
  return out + data;
}

Result<std::vector<Output>> RunAudio(const Stage& stage, const FieldValue& f,
                                     const std::string& id = "a") {
  return testing::RunStage(stage, {7, 0, id, "test"}, f);
}

FieldValue Bytes(std::string data) {
  FieldValue f;
  f.kind = FieldValue::Kind::kBytes;
  f.data = std::move(data);
  return f;
}

void ExpectClose(const std::vector<float>& ref, const float* got, float tol,
                 const std::string& what) {
  float worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) worst = std::max(worst, std::fabs(ref[i] - got[i]));
  EXPECT_LT(worst, tol) << what << ": max |diff| " << worst;
}

TEST(AudioStageTest, LogMelMatchesWhisperReferenceOnEveryBin) {
  std::vector<int64_t> shape;
  std::vector<float> ref = LoadNpy(TestData("audio/tone_logmel80.npy"), &shape);
  ASSERT_EQ(shape, (std::vector<int64_t>{80, 300}));
  auto stage = MakeStage("audio", "audio", {{"max_seconds", 3.0}});
  Result<std::vector<Output>> out = RunAudio(*stage, PathField(TestData("audio/tone.wav")));
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_EQ((*out)[0].spec.shape, shape);
  ExpectClose(ref, (*out)[0].As<float>(), 1e-3f, "80 mels");
  EXPECT_EQ(*(*out)[1].As<int32_t>(), 300);
}

TEST(AudioStageTest, PaddedWindowWith128MelsMatchesReference) {
  std::vector<int64_t> shape;
  std::vector<float> ref = LoadNpy(TestData("audio/tone_pad4s_logmel128.npy"), &shape);
  ASSERT_EQ(shape, (std::vector<int64_t>{128, 400}));
  auto stage = MakeStage("audio", "audio", {{"max_seconds", 4.0}, {"n_mels", int64_t{128}}});
  Result<std::vector<Output>> out = RunAudio(*stage, PathField(TestData("audio/tone.wav")));
  ASSERT_TRUE(out.ok()) << out.status().message();
  ExpectClose(ref, (*out)[0].As<float>(), 1e-3f, "128 mels, padded");
  EXPECT_EQ(*(*out)[1].As<int32_t>(), 300) << "valid frames exclude the padding";
}

// LogMel reads only the valid samples and skips the frames that see only the zeros after
// them: byte for byte what it gives for the same signal with its zeros written out, whatever
// the valid length (none of the padding, a frame's worth, most of the window, all of it).
TEST(AudioStageTest, LogMelOfValidSamplesEqualsTheZeroPaddedSignalsBitForBit) {
  const size_t n = 16000;
  LogMel mel(16000, 400, 160, 80);
  for (size_t valid : {size_t{1}, size_t{150}, size_t{401}, size_t{7777}, n - 201, n}) {
    std::vector<float> x(n, 0.0f);
    for (size_t i = 0; i < valid; ++i) x[i] = static_cast<float>(std::sin(i * 0.05) * 0.3);
    std::vector<float> whole(80 * mel.Frames(n)), skipped(whole.size(), -7.0f);
    mel.Compute(x.data(), n, whole.data());
    // Only `valid` samples readable: a copy that ends there.
    std::vector<float> head(x.begin(), x.begin() + static_cast<std::ptrdiff_t>(valid));
    mel.Compute(head.data(), n, skipped.data(), valid);
    EXPECT_EQ(std::memcmp(whole.data(), skipped.data(), whole.size() * sizeof(float)), 0)
        << "valid " << valid;
  }
}

// The vector code (sixteen frames at once in AVX-512, eight in AVX2, the log10 eight at a time)
// gives the portable code's bits: whole log-mel outputs compared byte for byte, for speech-like
// and loud signals and silence (every mel value from the 1e-10 floor up). 125 frames: seven
// blocks of sixteen, one of eight, five alone.
TEST(AudioStageTest, LogMelVectorCodeAndPortableGiveTheSameBytes) {
  if (!UseAvx512()) std::printf("no AVX-512 on this CPU: its sixteen-frame path is not tested\n");
  const size_t n = 20000;
  LogMel mel(16000, 400, 160, 80);
  std::mt19937 rng(3);
  std::normal_distribution<float> noise(0.0f, 1.0f);
  for (float gain : {0.0f, 1e-4f, 0.3f, 50.0f}) {
    std::vector<float> x(n);
    for (size_t i = 0; i < n; ++i)
      x[i] = gain * (static_cast<float>(std::sin(i * 0.05) * (1 + i % 97)) + noise(rng));
    std::vector<float> fast(80 * mel.Frames(n)), portable(fast.size());
    mel.Compute(x.data(), n, fast.data());
    UsePortableKernels(true);
    mel.Compute(x.data(), n, portable.data());
    UsePortableKernels(false);
    EXPECT_EQ(std::memcmp(fast.data(), portable.data(), fast.size() * sizeof(float)), 0)
        << "gain " << gain;
  }
}

// The log-mel's transform against a double-precision DFT, at sizes of every kind: powers of
// two, the radices 3, 5 and the generic prime butterfly, odd sizes (no real-to-complex split),
// and sizes with a prime factor above kMaxRadix (Bluestein's convolution), of frames times a
// window. Eight or sixteen frames at once give each frame's bits of one at a time.
TEST(AudioStageTest, PowerSpectrumMatchesADoublePrecisionDft) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int n : {2, 3, 4, 5, 7, 8, 12, 18, 49, 62, 98, 100, 127, 254, 400, 480, 512, 1021, 2042}) {
    PowerSpectrum ps(n);
    ASSERT_EQ(ps.Bins(), n / 2 + 1);
    const size_t stride = n + 3;  // frame f at frames[f * stride]
    std::vector<float> frames(16 * stride), window(n), power8(ps.Bins() * 8),
        power16(ps.Bins() * 16), power(ps.Bins());
    for (float& v : frames) v = u(rng);
    for (float& v : window) v = u(rng);
    const bool avx2 = UseAvx2(), avx512 = UseAvx512();  // Of8 is AVX2 code, Of16 AVX-512
    if (avx2) ps.Of8(frames.data(), stride, window.data(), power8.data());
    if (avx512) ps.Of16(frames.data(), stride, window.data(), power16.data());
    for (int f = 0; f < 16; ++f) {
      const float* frame = frames.data() + f * stride;
      ps.Of(frame, window.data(), power.data(), 1);
      double worst = 0, peak = 0;
      for (int k = 0; k < ps.Bins(); ++k) {
        double re = 0, im = 0;
        for (int t = 0; t < n; ++t) {
          const double a = -2 * M_PI * static_cast<double>(int64_t{t} * k % n) / n;
          const float x = frame[t] * window[t];  // the windowed sample, rounded as Of rounds it
          re += x * std::cos(a);
          im += x * std::sin(a);
        }
        peak = std::max(peak, re * re + im * im);
        worst = std::max(worst, std::fabs(re * re + im * im - power[k]));
        if (avx2 && f < 8) {
          EXPECT_EQ(std::memcmp(&power[k], &power8[static_cast<size_t>(k) * 8 + f], 4), 0)
              << "n " << n << " frame " << f << " bin " << k;
        }
        if (avx512) {
          EXPECT_EQ(std::memcmp(&power[k], &power16[static_cast<size_t>(k) * 16 + f], 4), 0)
              << "n " << n << " frame " << f << " bin " << k << " (sixteen frames)";
        }
      }
      EXPECT_LT(worst, 2e-6 * peak) << "n " << n;
    }
  }
}

// dtype: bfloat16 is the float32 output rounded, for log-mel features and waveforms.
TEST(AudioStageTest, BFloat16IsTheFloat32OutputRounded) {
  for (const char* features : {"log_mel", "waveform"}) {
    std::map<std::string, ParamValue> p = {{"max_seconds", 4.0},
                                           {"features", std::string(features)}};
    auto f32 = MakeStage("audio", "audio", p);
    p["dtype"] = std::string("bfloat16");
    auto bf16 = MakeStage("audio", "audio", p);
    Result<std::vector<Output>> a = RunAudio(*f32, PathField(TestData("audio/tone.wav")));
    Result<std::vector<Output>> b = RunAudio(*bf16, PathField(TestData("audio/tone.wav")));
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ((*b)[0].spec.dtype, DType::kBFloat16);
    EXPECT_EQ((*b)[0].spec.shape, (*a)[0].spec.shape);
    EXPECT_EQ(*(*b)[1].As<int32_t>(), *(*a)[1].As<int32_t>());
    const size_t n = (*a)[0].data.size() / 4;
    ASSERT_EQ((*b)[0].data.size(), n * 2);
    for (size_t i = 0; i < n; ++i)
      ASSERT_EQ((*b)[0].As<uint16_t>()[i], ToBFloat16((*a)[0].As<float>()[i])) << features << i;
  }
}

class AudioFormatsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(std::system("command -v ffmpeg > /dev/null"), 0)
        << "ffmpeg is needed to make the test media";
  }
  // Encodes tone.wav with the given ffmpeg arguments into dir/name.
  std::string Encode(const std::string& name, const std::string& args) {
    std::string path = dir_ / name;
    std::string cmd = "ffmpeg -loglevel error -y " + args + " " + path;
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    return path;
  }
  std::string Tone() const { return "-i " + TestData("audio/tone.wav"); }
  testing::TempDir dir_;
};

TEST_F(AudioFormatsTest, EveryCommonFormatDecodesToTheSameSignal) {
  std::vector<int64_t> shape;
  std::vector<float> ref = LoadNpy(TestData("audio/tone_logmel80.npy"), &shape);
  auto stage = MakeStage("audio", "audio", {{"max_seconds", 3.0}});
  struct Case {
    std::string file, args;
    float max_mean_diff;
  } cases[] = {
      {"t.flac", Tone() + " -sample_fmt s32 -c:a flac", 0.002f},
      {"t44k.flac", Tone() + " -ar 44100 -sample_fmt s32 -c:a flac",
       0.03f},  // resampled back to 16 kHz
      {"t.mp3", Tone() + " -c:a libmp3lame -b:a 192k", 0.08f},
      {"t.ogg", Tone() + " -ar 48000 -c:a libopus -b:a 96k", 0.08f},
      {"t.m4a", Tone() + " -c:a aac -b:a 192k", 0.08f},
      {"t.mp4",
       "-f lavfi -i testsrc=size=64x64:rate=10:duration=3 " + Tone() +
           " -c:v libx264 -pix_fmt yuv420p -c:a aac -b:a 192k -shortest",
       0.08f},  // audio track of a video
  };
  for (const Case& c : cases) {
    Result<std::vector<Output>> out = RunAudio(*stage, PathField(Encode(c.file, c.args)));
    ASSERT_TRUE(out.ok()) << c.file << ": " << out.status().message();
    const float* got = (*out)[0].As<float>();
    double sum = 0;
    for (size_t i = 0; i < ref.size(); ++i) sum += std::fabs(ref[i] - got[i]);
    EXPECT_LT(sum / ref.size(), c.max_mean_diff) << c.file;
    EXPECT_NEAR(*(*out)[1].As<int32_t>(), 300, 6) << c.file;
  }
}

TEST_F(AudioFormatsTest, WaveformAndSeededRandomCrop) {
  std::vector<float> wav(48000);
  std::string bytes = testing::ReadFile(TestData("audio/tone.wav"));
  std::memcpy(wav.data(), bytes.data() + 44, wav.size() * 4);
  auto whole =
      MakeStage("audio", "audio", {{"features", std::string("waveform")}, {"max_seconds", 3.5}});
  Result<std::vector<Output>> out = RunAudio(*whole, Bytes(bytes));
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_EQ((*out)[0].spec.shape, std::vector<int64_t>{56000});
  EXPECT_EQ(std::memcmp((*out)[0].data.data(), wav.data(), 48000 * 4), 0)
      << "a 16 kHz float WAV passes through exactly";
  EXPECT_EQ((*out)[0].As<float>()[50000], 0.0f) << "padding is zeros";
  EXPECT_EQ(*(*out)[1].As<int32_t>(), 48000);

  auto crop = MakeStage("audio", "audio",
                        {{"features", std::string("waveform")},
                         {"max_seconds", 1.0},
                         {"crop", std::string("random")}});
  auto a = RunAudio(*crop, Bytes(bytes), "x"), b = RunAudio(*crop, Bytes(bytes), "x"),
       c = RunAudio(*crop, Bytes(bytes), "y");
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ((*a)[0].data, (*b)[0].data);
  EXPECT_NE((*a)[0].data, (*c)[0].data);
  // The crop is a window of the signal.
  const float* w = (*a)[0].As<float>();
  bool found = false;
  for (int s = 0; s <= 32000 && !found; ++s) found = std::memcmp(wav.data() + s, w, 16000 * 4) == 0;
  EXPECT_TRUE(found);
}

// What libswresample makes of interleaved float samples with its defaults (as `ffmpeg -ar`
// and Whisper's load_audio do): mono float at `out_rate`, the flushed tail included.
std::vector<float> SwrDefaults(const std::vector<float>& x, int rate, int channels, int out_rate) {
  SwrContext* swr = nullptr;
  AVChannelLayout in, mono = AV_CHANNEL_LAYOUT_MONO;
  av_channel_layout_default(&in, channels);
  EXPECT_EQ(swr_alloc_set_opts2(&swr, &mono, AV_SAMPLE_FMT_FLT, out_rate, &in, AV_SAMPLE_FMT_FLT,
                                rate, 0, nullptr),
            0);
  EXPECT_EQ(swr_init(swr), 0);
  const int frames = static_cast<int>(x.size()) / channels;
  std::vector<float> out(static_cast<size_t>(swr_get_out_samples(swr, frames)) + 64);
  uint8_t* dst = reinterpret_cast<uint8_t*>(out.data());
  const uint8_t* src = reinterpret_cast<const uint8_t*>(x.data());
  int n = swr_convert(swr, &dst, static_cast<int>(out.size()), &src, frames);
  dst = reinterpret_cast<uint8_t*>(out.data() + n);
  n += swr_convert(swr, &dst, static_cast<int>(out.size()) - n, nullptr, 0);
  swr_free(&swr);
  out.resize(static_cast<size_t>(n));
  return out;
}

// DecodeAudio turns off libswresample's interpolation between filter phases where the rates'
// ratio needs at most its 1024 phases (every output falls on one): the same bits as its
// defaults, at the common rates, a ratio needing more phases (44056 Hz) and in stereo.
TEST(AudioStageTest, ResamplingEqualsLibswresamplesDefaults) {
  std::mt19937 rng(5);
  std::normal_distribution<float> noise(0.0f, 0.1f);
  for (int rate : {8000, 11025, 16000, 22050, 44056, 44100, 48000})
    for (int channels : {1, 2}) {
      std::vector<float> x(static_cast<size_t>(rate * channels));
      for (size_t i = 0; i < x.size(); ++i)
        x[i] = 0.4f * static_cast<float>(std::sin(i * 0.013 * (1 + i % channels))) + noise(rng);
      std::vector<float> got;
      ASSERT_TRUE(DecodeAudio(FloatWav(x, rate, channels), 16000, AudioLimits(), &got).ok());
      std::vector<float> want = SwrDefaults(x, rate, channels, 16000);
      ASSERT_EQ(got.size(), want.size()) << rate << " Hz, " << channels << " channels";
      EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
          << rate << " Hz, " << channels << " channels";
    }
}

TEST(AudioBadInputTest, EachIsAClearError) {
  AudioLimits limits;
  std::vector<float> out;
  auto error = [&](const std::string& bytes) {
    return DecodeAudio(bytes, 16000, limits, &out).message();
  };
  std::string wav = testing::ReadFile(TestData("audio/tone.wav"));
  EXPECT_NE(error("this is text, not audio").find("not a readable audio file"), std::string::npos);
  EXPECT_NE(error("").find("empty file"), std::string::npos);
  EXPECT_NE(error(wav.substr(0, wav.size() / 2))
                .find("truncated: WAV declares 192000 bytes of samples, file has 95978"),
            std::string::npos)
      << error(wav.substr(0, wav.size() / 2));
  EXPECT_NE(error(FloatWav({}, 16000)).find("no audio samples"), std::string::npos)
      << error(FloatWav({}, 16000));
  // A FLAC cut in the middle of a frame.
  testing::TempDir dir;
  std::string cmd = "ffmpeg -loglevel error -y -i " + TestData("audio/tone.wav") +
                    " -sample_fmt s16 " + dir / "t.flac";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  std::string flac = testing::ReadFile(dir / "t.flac");
  std::string cut_flac = error(flac.substr(0, flac.size() * 2 / 3));
  EXPECT_TRUE(cut_flac.find("truncated") != std::string::npos ||
              cut_flac.find("undecodable") != std::string::npos)
      << cut_flac;
  std::vector<float> nan(1600, 0.1f);
  nan[800] = std::nanf("");
  EXPECT_NE(error(FloatWav(nan, 16000)).find("NaN"), std::string::npos)
      << error(FloatWav(nan, 16000));
  std::string many = FloatWav(std::vector<float>(200 * 100, 0.0f), 16000, 200);
  EXPECT_NE(error(many).find("200 channels (limit 64)"), std::string::npos) << error(many);
  std::string fast = FloatWav(std::vector<float>(1000, 0.0f), 2000000);
  EXPECT_NE(error(fast).find("sample rate 2000000 Hz (limit 384000)"), std::string::npos)
      << error(fast);
  limits.max_seconds = 1;
  EXPECT_NE(error(wav).find("longer than max_file_seconds"), std::string::npos);
}

}  // namespace
}  // namespace mmfeed
