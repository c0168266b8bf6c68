// mmfeed-bench-audio: single-thread throughput of the audio stage (FFmpeg decode + resample to
// 16 kHz + Whisper log-mel, 80 mels, 30 s windows) over the given files, of a bare FFmpeg
// decode + libswresample of the same files (DecodeAudio alone, the file read included, as the
// stage reads it), and of the log-mel step alone; the stage and the bare decode alternate file by
// file, in one order or the other pass by pass (an even --repeat balances them). Prints JSON:
// seconds of audio processed per second of one core.
//   mmfeed-bench-audio [--repeat K] FILE...
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "engine/registry.h"
#include "source/sample.h"
#include "stages/audio/audio_decoder.h"
#include "stages/audio/log_mel.h"

using namespace mmfeed;

namespace {

// Seconds that fn() takes.
template <class Fn>
double Seconds(Fn fn) {
  const auto t0 = std::chrono::steady_clock::now();
  fn();
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

  // Each file decoded bare and through the stage, each timed alone, one right after the other: a
  // drift of the machine's speed during the run hits both alike. Pass -1 is untimed: it warms the
  // page cache, the allocator, FFmpeg's tables and the worker's own buffers (a daemon's worker is
  // warm after its first samples), and counts the audio seconds.
  double audio_seconds = 0, decode_s = 0, pipeline_s = 0;
  std::vector<float> samples;
  std::string storage;
  for (int r = -1; r < repeat; ++r) {
    for (const std::string& f : files) {
      FieldValue v;
      v.kind = FieldValue::Kind::kPath;
      v.data = f;
      Status decoded, st;
      const auto bare = [&] {
        return Seconds([&] {
          Result<std::string_view> bytes = FieldBytes(v, &storage);  // as the stage reads it
          decoded =
              bytes.ok() ? DecodeAudio(*bytes, 16000, AudioLimits(), &samples) : bytes.status();
        });
      };
      const auto stage = [&] {
        return Seconds([&] {
          st = worker->Process({0, 0, f, f}, v, OutputRow(ptrs.data(), ptrs.size()));
        });
      };
      // Whichever runs second finds the file's bytes warm in the CPU's caches (the ratio moved
      // by 0.023 with the order fixed one way or the other), so the order alternates by pass.
      double bare_s, stage_s;
      if (r % 2 == 0) {
        bare_s = bare();
        stage_s = stage();
      } else {
        stage_s = stage();
        bare_s = bare();
      }
      for (const Status& s : {decoded, st}) {
        if (!s.ok()) {
          std::fprintf(stderr, "%s: %s\n", f.c_str(), s.message().c_str());
          return 1;
        }
      }
      if (r < 0) {
        audio_seconds += samples.size() / 16000.0;
      } else {
        decode_s += bare_s;
        pipeline_s += stage_s;
      }
    }
  }

  // The log-mel step alone, on 30 s windows.
  LogMel mel(16000, 400, 160, 80);
  std::vector<float> window(30 * 16000), features(80 * 3000);
  for (size_t i = 0; i < window.size(); ++i)
    window[i] = static_cast<float>((i * 7919 % 2000) / 1000.0 - 1.0);
  const int windows = 40;
  mel.Compute(window.data(), window.size(), features.data());  // warm-up
  const double mel_s = Seconds([&] {
    for (int i = 0; i < windows; ++i) mel.Compute(window.data(), window.size(), features.data());
  });

  std::printf(
      "{\"files\": %zu, \"audio_seconds\": %.1f, \"pipeline_audio_s_per_s\": %.1f, "
      "\"decode_resample_audio_s_per_s\": %.1f, \"log_mel_audio_s_per_s\": %.1f}\n",
      files.size(), audio_seconds * repeat, audio_seconds * repeat / pipeline_s,
      audio_seconds * repeat / decode_s, windows * 30.0 / mel_s);
  return 0;
}
