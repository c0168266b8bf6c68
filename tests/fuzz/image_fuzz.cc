// libFuzzer target: the image stage (libjpeg-turbo region decode, OpenCV for the rest) and the
// qwen_vision stage (smart_resize, bicubic, patches) on arbitrary bytes return a Status, never
// crash or allocate without bound.
#include <map>
#include <string>
#include <vector>

#include "engine/registry.h"

namespace {

std::unique_ptr<mmfeed::Stage> Make(const std::string& type,
                                    const std::map<std::string, mmfeed::ParamValue>& params) {
  const mmfeed::StageSchema* schema = mmfeed::Registry::Get().Find(type);
  mmfeed::StageArgs args;
  args.name = type;
  for (const auto& p : schema->params)
    if (p.default_value) args.params.Set(p.name, *p.default_value);
  for (const auto& [k, v] : params) args.params.Set(k, v);
  return std::move(schema->factory(args).value());
}

// Runs one worker of `stage` on `f`, into outputs sized as the stage declares.
void Run(const mmfeed::Stage& stage, mmfeed::StageWorker* worker, const mmfeed::FieldValue& f) {
  static thread_local std::vector<std::vector<uint8_t>> outs;
  std::vector<uint8_t*> ptrs;
  const auto specs = stage.OutputSpecs();
  outs.resize(specs.size());
  for (size_t k = 0; k < specs.size(); ++k) {
    outs[k].resize(specs[k].NumBytes());
    ptrs.push_back(outs[k].data());
  }
  (void)worker->Process({1, 0, "fuzz", "fuzz"}, f, mmfeed::OutputRow(ptrs.data(), ptrs.size()));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static std::unique_ptr<mmfeed::Stage> image =
      Make("image", {{"size", std::vector<int64_t>{32, 32}},
                     {"crop", std::string("random_resized_crop")},
                     {"dtype", std::string("float32")},
                     {"layout", std::string("CHW")},
                     {"max_pixels", int64_t{4 << 20}}});
  static std::unique_ptr<mmfeed::Stage> qwen =
      Make("qwen_vision", {{"min_pixels", int64_t{4096}},
                           {"max_pixels", int64_t{16384}},
                           {"max_source_pixels", int64_t{4 << 20}}});
  static std::unique_ptr<mmfeed::StageWorker> image_worker = image->NewWorker();
  static std::unique_ptr<mmfeed::StageWorker> qwen_worker = qwen->NewWorker();
  mmfeed::FieldValue f;
  f.kind = mmfeed::FieldValue::Kind::kBytes;
  f.data.assign(reinterpret_cast<const char*>(data), size);
  Run(*image, image_worker.get(), f);
  Run(*qwen, qwen_worker.get(), f);
  return 0;
}
