// mmfeed-bench-audio: single-thread throughput of the audio stage (FFmpeg decode + resample to
// 16 kHz + Whisper log-mel, 80 mels, 30 s windows) over the given files, of a bare FFmpeg
// decode + libswresample of the same files (DecodeAudio alone, the file read included, as the
// stage reads it), and of the log-mel step alone. Prints JSON: seconds of audio processed per
// second of one core.
//   mmfeed-bench-audio [--repeat K] FILE...
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "engine/registry.h"
#include "source/sample.h"
#include "stages/audio/audio_decoder.h"
#include "stages/audio/log_mel.h"

using namespace mmfeed;

namespace {

// Seconds that `repeat` timed passes of pass(r) take, after an untimed one (r = -1) that warms
// the page cache, the allocator, FFmpeg's tables and the worker's own buffers (a daemon's worker
// is warm after its first samples); none if a pass returns false (it says why).
template <class Pass>
std::optional<double> TimedPasses(int repeat, Pass pass) {
  if (!pass(-1)) return std::nullopt;
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < repeat; ++r)
    if (!pass(r)) return std::nullopt;
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  int repeat = 3;
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--repeat" && i + 1 < argc)
      repeat = std::stoi(argv[++i]);
    else
      files.push_back(a);
  }
  const StageSchema* schema = Registry::Get().Find("audio");
  StageArgs args;
  args.name = "audio";
  for (const auto& p : schema->params)
    if (p.default_value) args.params.Set(p.name, *p.default_value);
  std::unique_ptr<Stage> stage = std::move(schema->factory(args).value());
  std::unique_ptr<StageWorker> worker = stage->NewWorker();
  std::vector<std::vector<uint8_t>> outs;
  std::vector<uint8_t*> ptrs;
  for (const TensorSpec& s : stage->OutputSpecs()) outs.emplace_back(s.NumBytes());
  for (auto& o : outs) ptrs.push_back(o.data());

  // The bare decode + resample, which also gives the audio seconds per file (its warm-up pass).
  double audio_seconds = 0;
  std::vector<float> samples;
  std::string storage;
  const std::optional<double> decode_s = TimedPasses(repeat, [&](int r) {
    for (const std::string& f : files) {
      FieldValue v;
      v.kind = FieldValue::Kind::kPath;
      v.data = f;
      Result<std::string_view> bytes = FieldBytes(v, &storage);  // as the stage reads it
      if (!bytes.ok() || !DecodeAudio(*bytes, 16000, AudioLimits(), &samples).ok()) {
        std::fprintf(stderr, "cannot decode %s\n", f.c_str());
        return false;
      }
      if (r < 0) audio_seconds += samples.size() / 16000.0;
    }
    return true;
  });
  if (!decode_s) return 1;
  // The stage the same way.
  const std::optional<double> pipeline_s = TimedPasses(repeat, [&](int) {
    for (const std::string& f : files) {
      FieldValue v;
      v.kind = FieldValue::Kind::kPath;
      v.data = f;
      Status st = worker->Process({0, 0, f, f}, v, OutputRow(ptrs.data(), ptrs.size()));
      if (!st.ok()) {
        std::fprintf(stderr, "%s: %s\n", f.c_str(), st.message().c_str());
        return false;
      }
    }
    return true;
  });
  if (!pipeline_s) return 1;

  // The log-mel step alone, on 30 s windows.
  LogMel mel(16000, 400, 160, 80);
  std::vector<float> window(30 * 16000), features(80 * 3000);
  for (size_t i = 0; i < window.size(); ++i)
    window[i] = static_cast<float>((i * 7919 % 2000) / 1000.0 - 1.0);
  const int windows = 40;
  const double mel_s = *TimedPasses(windows, [&](int) {
    mel.Compute(window.data(), window.size(), features.data());
    return true;
  });

  std::printf(
      "{\"files\": %zu, \"audio_seconds\": %.1f, \"pipeline_audio_s_per_s\": %.1f, "
      "\"decode_resample_audio_s_per_s\": %.1f, \"log_mel_audio_s_per_s\": %.1f}\n",
      files.size(), audio_seconds * repeat, audio_seconds * repeat / *pipeline_s,
      audio_seconds * repeat / *decode_s, windows * 30.0 / mel_s);
  return 0;
}
