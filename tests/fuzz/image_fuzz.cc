// libFuzzer target: the image stage (libjpeg-turbo region decode, OpenCV for the rest) on
// arbitrary bytes returns a Status, never crashes or allocates without bound.
#include <string>
#include <vector>

#include "stages/runtime/registry.h"

namespace {

std::unique_ptr<mmfeed::Stage> MakeImage() {
  const mmfeed::StageSchema* schema = mmfeed::Registry::Get().Find("image");
  mmfeed::StageArgs args;
  args.name = "image";
  for (const auto& p : schema->params)
    if (p.default_value) args.params.Set(p.name, *p.default_value);
  args.params.Set("size", std::vector<int64_t>{32, 32});
  args.params.Set("crop", std::string("random_resized_crop"));
  args.params.Set("dtype", std::string("float32"));
  args.params.Set("layout", std::string("CHW"));
  args.params.Set("max_pixels", int64_t{4 << 20});
  return std::move(schema->factory(args).value());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static std::unique_ptr<mmfeed::Stage> stage = MakeImage();
  static std::unique_ptr<mmfeed::StageWorker> worker = stage->NewWorker();
  static std::vector<uint8_t> out(3 * 32 * 32 * 4);
  mmfeed::FieldValue f;
  f.kind = mmfeed::FieldValue::Kind::kBytes;
  f.data.assign(reinterpret_cast<const char*>(data), size);
  uint8_t* ptr = out.data();
  worker->Process({1, 0, "fuzz", "fuzz"}, f, mmfeed::OutputRow(&ptr, 1));
  return 0;
}
