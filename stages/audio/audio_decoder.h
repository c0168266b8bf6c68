// Audio decoding with FFmpeg: any container and codec Debian's FFmpeg reads (WAV, FLAC, MP3,
// Opus/Ogg, AAC/M4A, the audio track of a video), from bytes in memory through a custom
// AVIOContext (no temp files), resampled with libswresample to mono float32.
// Stateless between calls; one call per sample, from any worker thread.
#pragma once

#include <string_view>
#include <vector>

#include "base/status.h"

namespace mmfeed {

struct AudioLimits {
  int max_channels = 64;
  int max_sample_rate = 384000;
  double max_seconds = 3600;  // refuse longer files rather than decode them
};

// Decodes `bytes` to mono float32 at `sample_rate` into *out. Errors: not audio, no audio
// stream, limits exceeded, truncated (decodes to clearly less than the container declares),
// undecodable packets, zero samples, NaN/Inf samples.
Status DecodeAudio(std::string_view bytes, int sample_rate, const AudioLimits& limits,
                   std::vector<float>* out);

}  // namespace mmfeed
