// libFuzzer target: the video stage (FFmpeg demux/decode through our AVIOContext, seeking,
// keyframe index, swscale) on arbitrary bytes returns a Status, never crashes or leaks. The
// first byte picks the sampling mode, so seeking paths get fuzzed too.
#include <string>
#include <vector>

#include "stages/runtime/registry.h"

namespace {

std::unique_ptr<mmfeed::Stage> MakeVideo(const char* sampling) {
  const mmfeed::StageSchema* schema = mmfeed::Registry::Get().Find("video");
  mmfeed::StageArgs args;
  args.name = "video";
  for (const auto& p : schema->params)
    if (p.default_value) args.params.Set(p.name, *p.default_value);
  args.params.Set("sampling", std::string(sampling));
  args.params.Set("frames", int64_t{4});
  args.params.Set("size", std::vector<int64_t>{16, 16});
  args.params.Set("max_pixels", int64_t{1 << 20});
  return std::move(schema->factory(args).value());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static std::unique_ptr<mmfeed::Stage> stages[3] = {MakeVideo("uniform"), MakeVideo("clip"),
                                                     MakeVideo("keyframes")};
  static std::unique_ptr<mmfeed::StageWorker> workers[3] = {
      stages[0]->NewWorker(), stages[1]->NewWorker(), stages[2]->NewWorker()};
  static std::vector<uint8_t> frames(4 * 3 * 16 * 16), pts(4 * 4), mask(4);
  if (size < 1) return 0;
  mmfeed::FieldValue f;
  f.kind = mmfeed::FieldValue::Kind::kBytes;
  f.data.assign(reinterpret_cast<const char*>(data) + 1, size - 1);
  uint8_t* ptrs[3] = {frames.data(), pts.data(), mask.data()};
  workers[data[0] % 3]->Process({1, 0, "fuzz", "fuzz"}, f, mmfeed::OutputRow(ptrs, 3));
  return 0;
}
