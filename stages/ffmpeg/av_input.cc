#include "stages/ffmpeg/av_input.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>

extern "C" {
#include <libavformat/avformat.h>
#include <libavutil/log.h>
}

namespace mmfeed {
namespace {

constexpr int kIoBufferBytes = 256 * 1024;

void LogToSpdlog(void* avcl, int level, const char* format, va_list args) {
  if (level > AV_LOG_WARNING || !spdlog::should_log(spdlog::level::debug)) return;
  char line[1024];
  int print_prefix = 1;
  av_log_format_line2(avcl, level, format, args, line, sizeof(line), &print_prefix);
  size_t n = std::strlen(line);
  while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = '\0';
  spdlog::debug("ffmpeg: {}", line);
}

}  // namespace

std::string AvError(int err) {
  char buf[AV_ERROR_MAX_STRING_SIZE] = {};
  av_strerror(err, buf, sizeof(buf));
  return buf;
}

void RouteFfmpegLogs() {
  static std::once_flag once;
  std::call_once(once, [] { av_log_set_callback(&LogToSpdlog); });
}

AvInput::~AvInput() {
  avformat_close_input(&fmt_);  // frees fmt_; io_ is ours
  if (io_) av_freep(&io_->buffer);
  avio_context_free(&io_);
}

int64_t AvInput::Size() const {
  return file_.fd() >= 0 ? static_cast<int64_t>(file_.size()) : static_cast<int64_t>(mem_.size());
}

int AvInput::Read(void* opaque, uint8_t* buf, int size) {
  auto* in = static_cast<AvInput*>(opaque);
  if (SampleDeadlinePassed()) return AVERROR_EXIT;
  const int64_t left = in->Size() - in->pos_;
  if (left <= 0) return AVERROR_EOF;
  const int want = static_cast<int>(std::min<int64_t>(left, size));
  if (in->file_.fd() < 0) {
    std::memcpy(buf, in->mem_.data() + in->pos_, want);
    in->pos_ += want;
    return want;
  }
  while (true) {
    ssize_t n =
        ::pread(in->file_.fd(), buf, want, static_cast<off_t>(in->file_.offset() + in->pos_));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return AVERROR(errno);
    if (n == 0) return AVERROR_EOF;  // the file shrank under us
    in->pos_ += n;
    return static_cast<int>(n);
  }
}

int64_t AvInput::Seek(void* opaque, int64_t offset, int whence) {
  auto* in = static_cast<AvInput*>(opaque);
  const int64_t total = in->Size();
  whence &= ~AVSEEK_FORCE;
  if (whence == AVSEEK_SIZE) return total;
  const int64_t base = whence == SEEK_CUR ? in->pos_ : whence == SEEK_END ? total : 0;
  const int64_t target = base + offset;
  if (target < 0 || target > total) return AVERROR(EINVAL);
  in->pos_ = target;
  return target;
}

Status AvInput::Open(const FieldValue& field, const char* what, int64_t probe_bytes) {
  if (field.kind == FieldValue::Kind::kText || field.kind == FieldValue::Kind::kBytes)
    return OpenBytes(field.data, what, probe_bytes);
  MMFEED_ASSIGN_OR_RETURN(FieldFile file, FieldFile::Open(field));
  file_ = std::move(file);
  return OpenContainer(what, probe_bytes);
}

Status AvInput::OpenBytes(std::string_view bytes, const char* what, int64_t probe_bytes,
                          bool probe_packets) {
  mem_ = bytes;
  return OpenContainer(what, probe_bytes, probe_packets);
}

Status AvInput::OpenContainer(const char* what, int64_t probe_bytes, bool probe_packets) {
  if (Size() == 0) return Status::Corrupt("empty file (0 bytes)");
  auto* buffer = static_cast<uint8_t*>(av_malloc(kIoBufferBytes));
  if (buffer)
    io_ = avio_alloc_context(buffer, kIoBufferBytes, 0, this, &AvInput::Read, nullptr,
                             &AvInput::Seek);
  if (!io_) {
    av_free(buffer);
    return Status::Io("out of memory (AVIOContext)");
  }
  fmt_ = avformat_alloc_context();
  if (!fmt_) return Status::Io("out of memory (AVFormatContext)");
  fmt_->pb = io_;
  fmt_->flags |= AVFMT_FLAG_CUSTOM_IO;
  fmt_->interrupt_callback = {[](void*) { return SampleDeadlinePassed() ? 1 : 0; }, nullptr};
  fmt_->probesize = probe_bytes;
  if (!probe_packets) fmt_->max_probe_packets = 1;
  int err = avformat_open_input(&fmt_, nullptr, nullptr, nullptr);  // frees fmt_ on failure
  if (err < 0)
    return Status::Corrupt(fmt::format(
        "not a readable {} file (unknown container, or truncated: {})", what, AvError(err)));
  return Status::Ok();
}

}  // namespace mmfeed
