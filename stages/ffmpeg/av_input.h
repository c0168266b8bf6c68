// Opening a container with FFmpeg from a sample's field, without temp files: a file path or a
// tar member is read in place with pread, bytes in memory are read from memory; both go
// through one custom AVIOContext, so seeking works the same way for all three.
// Shared by the audio and video stages. One AvInput per decode; not thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "base/status.h"
#include "engine/stage.h"

struct AVFormatContext;
struct AVIOContext;

namespace mmfeed {

// FFmpeg's text for an AVERROR code.
std::string AvError(int err);

// Sends FFmpeg's own log lines (warnings and errors about damaged streams) to spdlog at
// debug level instead of stderr: the stages report damage as per-sample errors themselves.
// Idempotent; call from a stage factory.
void RouteFfmpegLogs();

class AvInput {
 public:
  AvInput() = default;
  AvInput(const AvInput&) = delete;
  AvInput& operator=(const AvInput&) = delete;
  ~AvInput();

  // Opens the container holding `field` (kPath, kFileRange or kBytes). `what` names the media
  // for messages ("audio", "video"). Demuxer probing reads at most `probe_bytes`.
  Status Open(const FieldValue& field, const char* what, int64_t probe_bytes = 1 << 20);
  // Opens `bytes`, which must outlive this object. `probe_packets` false: a stream whose codec
  // the container names is taken as named (FFmpeg otherwise probes its first packets for
  // another codec, as it does for PCM in WAV: 2.4 ms a file, ten times reading the file's
  // packets; measured on the audio bench's WAV files).
  Status OpenBytes(std::string_view bytes, const char* what, int64_t probe_bytes = 1 << 20,
                   bool probe_packets = true);

  AVFormatContext* fmt() const { return fmt_; }
  // Names the file contents for caches: path, byte range, size and mtime; "" for bytes in
  // memory (they have no stable identity).
  const std::string& identity() const { return file_.identity(); }

 private:
  Status OpenContainer(const char* what, int64_t probe_bytes, bool probe_packets = true);
  int64_t Size() const;
  static int Read(void* opaque, uint8_t* buf, int size);
  static int64_t Seek(void* opaque, int64_t offset, int whence);

  // The bytes: a file's range (file_.fd() >= 0), or memory (mem_).
  FieldFile file_;
  std::string_view mem_;
  int64_t pos_ = 0;
  AVIOContext* io_ = nullptr;
  AVFormatContext* fmt_ = nullptr;
};

}  // namespace mmfeed
