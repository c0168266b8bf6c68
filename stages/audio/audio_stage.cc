// The `audio` stage: decode with FFmpeg, resample to `sample_rate` mono, cut or pad to
// `max_seconds` (from the head, or from a start drawn per sample), and output either the
// waveform or Whisper's log-mel features.
// Outputs: <name> [n_mels, frames] (log_mel) or [samples] (waveform), float32; and
// <name>_lengths int32: the valid frames (or samples) before padding.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/rng.h"
#include "engine/registry.h"
#include "stages/audio/audio_decoder.h"
#include "stages/audio/log_mel.h"
#include "stages/ffmpeg/av_input.h"

namespace mmfeed {
namespace {

struct AudioParams {
  std::string name;
  int sample_rate = 16000;
  bool log_mel = true;
  int n_mels = 80, n_fft = 400, hop = 160;
  int64_t window = 0;  // samples: max_seconds * sample_rate
  bool random_crop = false;
  DType dtype = DType::kFloat32;  // or bfloat16
  AudioLimits limits;

  std::vector<int64_t> FeatureShape() const {
    return log_mel ? std::vector<int64_t>{n_mels, window / hop} : std::vector<int64_t>{window};
  }
};

class AudioWorker : public StageWorker {
 public:
  explicit AudioWorker(const AudioParams& p) : p_(p) {
    if (p_.log_mel) mel_ = std::make_unique<LogMel>(p_.sample_rate, p_.n_fft, p_.hop, p_.n_mels);
  }

  Status Process(const SampleContext& ctx, const FieldValue& in, const OutputRow& out) override {
    // The decoded waveform: decoded now, or (a `cache:` with crop: random, OwnCache) kept from
    // an earlier epoch as float32 samples.
    std::shared_ptr<const std::string> kept;
    const float* samples = nullptr;
    int64_t n = 0;
    if (ctx.memo) kept = ctx.memo->Find();
    if (!kept) {
      MMFEED_ASSIGN_OR_RETURN(std::string_view bytes, FieldBytes(in, &file_));
      MMFEED_RETURN_IF_ERROR(DecodeAudio(bytes, p_.sample_rate, p_.limits, &samples_));
      if (ctx.memo)
        kept = ctx.memo->Keep(std::string(reinterpret_cast<const char*>(samples_.data()),
                                          samples_.size() * sizeof(float)));
      samples = samples_.data();
      n = static_cast<int64_t>(samples_.size());
    } else {
      samples = reinterpret_cast<const float*>(kept->data());
      n = static_cast<int64_t>(kept->size() / sizeof(float));
    }
    // Cut or pad to the window.
    int64_t start = 0;
    if (n > p_.window && p_.random_crop) {
      Rng rng(ctx.seed, ctx.epoch, ctx.id, p_.name);
      start = static_cast<int64_t>(rng.Below(static_cast<uint64_t>(n - p_.window + 1)));
    }
    const int64_t valid = std::min(n - start, p_.window);
    // float32 features go straight to the output; bfloat16 ones are rounded from float32.
    const bool f32 = p_.dtype == DType::kFloat32;
    const std::vector<int64_t> shape = p_.FeatureShape();
    const size_t count = static_cast<size_t>(shape.size() == 2 ? shape[0] * shape[1] : shape[0]);
    if (!f32) features_.resize(count);
    float* features = f32 ? out.As<float>(0) : features_.data();
    if (p_.log_mel) {
      const size_t window = static_cast<size_t>(p_.window);
      mel_->Compute(samples + start, window, features, static_cast<size_t>(valid));
      int64_t frames = static_cast<int64_t>(mel_->Frames(window));
      *out.As<int32_t>(1) =
          static_cast<int32_t>(std::min<int64_t>(frames, (valid + p_.hop - 1) / p_.hop));
    } else {
      std::memcpy(features, samples + start, static_cast<size_t>(valid) * sizeof(float));
      std::fill(features + valid, features + count, 0.0f);
      *out.As<int32_t>(1) = static_cast<int32_t>(valid);
    }
    if (!f32) {
      uint16_t* bf16 = out.As<uint16_t>(0);
      for (size_t i = 0; i < count; ++i) bf16[i] = ToBFloat16(features[i]);
    }
    return Status::Ok();
  }

 private:
  const AudioParams& p_;
  std::unique_ptr<LogMel> mel_;
  std::string file_;
  std::vector<float> samples_, features_;
};

class AudioStage : public Stage {
 public:
  explicit AudioStage(AudioParams p) : p_(std::move(p)) {}
  std::vector<TensorSpec> OutputSpecs() const override {
    return {{p_.name, p_.dtype, p_.FeatureShape()}, {p_.name + "_lengths", DType::kInt32, {}}};
  }
  std::unique_ptr<StageWorker> NewWorker() const override {
    return std::make_unique<AudioWorker>(p_);
  }
  WhyNot WhyNotCacheable() const override {
    if (p_.random_crop) return "crop: random draws a new window every epoch";
    return std::nullopt;
  }
  std::optional<std::string> OwnCache() const override {
    return "the waveform decoded and resampled (4 bytes a sample), then cut and its features "
           "computed per epoch: outputs equal the config without cache:";
  }

 private:
  AudioParams p_;
};

Result<std::unique_ptr<Stage>> MakeAudioStage(const StageArgs& a) {
  RouteFfmpegLogs();
  const Params& prm = a.params;
  AudioParams p;
  p.name = a.name;
  p.sample_rate = static_cast<int>(prm.GetInt("sample_rate"));
  if (p.sample_rate < 1000 || p.sample_rate > 192000)
    return Status::Invalid("sample_rate must be in 1000..192000");
  p.log_mel = prm.GetString("features") == "log_mel";
  p.n_mels = static_cast<int>(prm.GetInt("n_mels"));
  p.n_fft = static_cast<int>(prm.GetInt("n_fft"));
  p.hop = static_cast<int>(prm.GetInt("hop_length"));
  if (p.n_mels < 1 || p.n_mels > 512) return Status::Invalid("n_mels must be in 1..512");
  if (p.n_fft < 16 || p.n_fft > 65536 || p.hop < 1 || p.hop > p.n_fft)
    return Status::Invalid("need 16 <= n_fft <= 65536 and 1 <= hop_length <= n_fft");
  double seconds = prm.GetFloat("max_seconds");
  if (!(seconds > 0) || seconds > 3600) return Status::Invalid("max_seconds must be in (0, 3600]");
  p.window = static_cast<int64_t>(std::llround(seconds * p.sample_rate));
  if (p.log_mel && p.window <= p.n_fft / 2)
    return Status::Invalid("max_seconds is shorter than half an FFT window");
  p.random_crop = prm.GetString("crop") == "random";
  ParseDType(prm.GetString("dtype"), &p.dtype);
  p.limits.max_channels = static_cast<int>(prm.GetInt("max_channels"));
  p.limits.max_sample_rate = static_cast<int>(prm.GetInt("max_sample_rate"));
  p.limits.max_seconds = prm.GetFloat("max_file_seconds");
  return std::unique_ptr<Stage>(new AudioStage(std::move(p)));
}

MMFEED_REGISTER_STAGE((StageSchema{
    "audio",
    "decode audio with FFmpeg, resample to mono, cut/pad to max_seconds, output the waveform or "
    "Whisper's log-mel. Outputs: <name> float32 (or bfloat16) [n_mels, frames] or [samples], "
    "<name>_lengths int32",
    StageKind::kField,
    /*field_is_path=*/true,
    {
        Ranged({"sample_rate", ParamType::kInt, int64_t{16000}, "output sample rate (Hz), mono"},
               1000, 192000),
        {"features",
         ParamType::kString,
         std::string("log_mel"),
         "log_mel | waveform",
         {"log_mel", "waveform"}},
        Ranged({"n_mels", ParamType::kInt, int64_t{80},
                "mel bands (Whisper: 80, or 128 for large-v3)"},
               1, 512),
        Ranged({"n_fft", ParamType::kInt, int64_t{400},
                "FFT size (Hann window of the same length)"},
               16, 65536),
        Ranged({"hop_length", ParamType::kInt, int64_t{160}, "samples between frames"}, 1, 65536),
        Ranged({"max_seconds", ParamType::kFloat, 30.0,
                "window: longer audio is cut, shorter is zero-padded"},
               std::nullopt, 3600),
        {"crop",
         ParamType::kString,
         std::string("head"),
         "head | random: where a longer clip is cut (random: seeded per sample)",
         {"head", "random"}},
        {"dtype",
         ParamType::kString,
         std::string("float32"),
         "float32 | bfloat16 (rounded to the nearest)",
         {"float32", "bfloat16"}},
        {"max_channels", ParamType::kInt, int64_t{64}, "refuse files with more channels"},
        {"max_sample_rate", ParamType::kInt, int64_t{384000},
         "refuse files with a higher sample rate"},
        {"max_file_seconds", ParamType::kFloat, 3600.0,
         "refuse files that decode to more than this"},
    },
    MakeAudioStage}));

}  // namespace
}  // namespace mmfeed
