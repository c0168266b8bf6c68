// libFuzzer target: the video stage (FFmpeg demux/decode through our AVIOContext, seeking,
// keyframe index, swscale) and the qwen_video stage (frames chosen from the stream's count and
// rate, smart_resize, bicubic, patches) on arbitrary bytes return a Status, never crash or
// leak. The first byte picks the stage and sampling mode, so seeking paths get fuzzed too.
#include <string>
#include <vector>

#include "engine/registry.h"

namespace {

struct Fuzzed {
  std::unique_ptr<mmfeed::Stage> stage;
  std::unique_ptr<mmfeed::StageWorker> worker;
  std::vector<std::vector<uint8_t>> outs;
  std::vector<uint8_t*> ptrs;
};

Fuzzed Make(const char* type, const std::vector<std::pair<std::string, mmfeed::ParamValue>>& set) {
  const mmfeed::StageSchema* schema = mmfeed::Registry::Get().Find(type);
  mmfeed::StageArgs args;
  args.name = type;
  for (const auto& p : schema->params)
    if (p.default_value) args.params.Set(p.name, *p.default_value);
  for (const auto& [key, value] : set) args.params.Set(key, value);
  Fuzzed f;
  f.stage = std::move(schema->factory(args).value());
  f.worker = f.stage->NewWorker();
  for (const mmfeed::TensorSpec& spec : f.stage->OutputSpecs())
    f.outs.emplace_back(spec.NumBytes());
  for (auto& o : f.outs) f.ptrs.push_back(o.data());
  return f;
}

Fuzzed MakeVideo(const char* sampling) {
  return Make("video", {{"sampling", std::string(sampling)},
                        {"frames", int64_t{4}},
                        {"size", std::vector<int64_t>{16, 16}},
                        {"max_pixels", int64_t{1 << 20}}});
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Fuzzed stages[4] = {MakeVideo("uniform"), MakeVideo("clip"), MakeVideo("keyframes"),
                             Make("qwen_video", {{"max_frames", int64_t{8}},
                                                 {"min_pixels", int64_t{4096}},
                                                 {"max_pixels", int64_t{32768}},
                                                 {"max_source_pixels", int64_t{1 << 20}}})};
  if (size < 1) return 0;
  mmfeed::FieldValue f;
  f.kind = mmfeed::FieldValue::Kind::kBytes;
  f.data.assign(reinterpret_cast<const char*>(data) + 1, size - 1);
  Fuzzed& s = stages[data[0] % 4];
  (void)s.worker->Process({1, 0, "fuzz", "fuzz"}, f,
                          mmfeed::OutputRow(s.ptrs.data(), s.ptrs.size()));
  return 0;
}
