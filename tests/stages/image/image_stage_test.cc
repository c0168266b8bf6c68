#include <gtest/gtest.h>

#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <random>

#include "base/simd.h"
#include "stages/common/resample.h"
#include "stages/image/jpeg_decoder.h"
#include "tests/stage_util.h"
#include "tests/test_util.h"

namespace mmfeed {
namespace {

using testing::MakeStage;
using testing::PathField;
using testing::TestData;

using testing::Output;

Result<Output> RunImage(const Stage& stage, const FieldValue& in, const std::string& id = "x",
                        uint32_t epoch = 0) {
  Result<std::vector<Output>> out = testing::RunStage(stage, {42, epoch, id, "test"}, in);
  if (!out.ok()) return out.status();
  return std::move(out.value()[0]);
}

TEST(ImageStageTest, CenterCropMatchesAFullDecodeReference) {
  auto stage = MakeStage("image", "image",
                         {{"crop", std::string("center")},
                          {"resize", int64_t{256}},
                          {"size", std::vector<int64_t>{224, 224}}});
  for (const char* name :
       {"photo00.jpg", "photo05.jpg", "photo09.jpg", "photo00_progressive.jpg"}) {
    std::string path = TestData(std::string("photos/") + name);
    Result<Output> t = RunImage(*stage, PathField(path));
    ASSERT_TRUE(t.ok()) << t.status().message();
    ASSERT_EQ(t->spec.shape, (std::vector<int64_t>{224, 224, 3}));
    // Reference: decode every pixel with OpenCV, resize the shorter side to 256, crop 224.
    // Resampling differs (DCT scaling + bilinear vs area), which shows on sharp edges; the
    // shifted-crop check below is what catches a misplaced crop.
    cv::Mat bgr = cv::imread(path, cv::IMREAD_COLOR), rgb, small;
    cv::cvtColor(bgr, rgb, cv::COLOR_BGR2RGB);
    double s = 256.0 / std::min(rgb.cols, rgb.rows);
    cv::resize(rgb, small,
               cv::Size(static_cast<int>(std::lround(rgb.cols * s)),
                        static_cast<int>(std::lround(rgb.rows * s))),
               0, 0, cv::INTER_AREA);
    cv::Mat ref = small(cv::Rect((small.cols - 224) / 2, (small.rows - 224) / 2, 224, 224)).clone();
    cv::Mat got(224, 224, CV_8UC3, t->data.data());
    double diff = cv::norm(got, ref, cv::NORM_L1) / (224.0 * 224 * 3);
    EXPECT_LT(diff, 16.0) << name << ": mean abs difference " << diff;
    // A crop shifted by 16 pixels must be clearly worse, so the test can see a misplaced crop.
    cv::Mat shifted =
        small(cv::Rect((small.cols - 224) / 2 + 16, (small.rows - 224) / 2, 224, 224));
    EXPECT_GT(cv::norm(got, shifted, cv::NORM_L1) / (224.0 * 224 * 3), diff * 1.5) << name;
  }
}

// A `cache:` on a random_resized_crop stage keeps each image decoded at full size: the first
// epoch decodes and keeps it, later ones crop the kept pixels; every epoch's bytes equal
// dct_scaling: off's (JPEG baseline, progressive, gray; PNG), flips included.
TEST(ImageStageTest, ACachedDecodeGivesTheBytesOfDctScalingOff) {
  class OneSampleMemo : public SampleMemo {
   public:
    std::shared_ptr<const std::string> Find() override {
      ++finds;
      return kept;
    }
    std::shared_ptr<const std::string> Keep(std::string bytes) override {
      kept = std::make_shared<const std::string>(std::move(bytes));
      return kept;
    }
    std::shared_ptr<const std::string> kept;
    int finds = 0;
  };
  const std::map<std::string, ParamValue> params = {{"crop", std::string("random_resized_crop")},
                                                    {"size", std::vector<int64_t>{96, 64}},
                                                    {"flip", 0.5},
                                                    {"dtype", std::string("float32")},
                                                    {"dct_scaling", std::string("off")}};
  auto plain = MakeStage("image", "image", params);
  auto cached = MakeStage("image", "image", params);
  EXPECT_TRUE(plain->OwnCache().has_value());
  auto with_on = params;
  with_on["dct_scaling"] = std::string("on");
  EXPECT_FALSE(MakeStage("image", "image", with_on)->OwnCache()) << "not what it asked for";
  // Why not, or nothing: a random crop says why; a center crop without flip is cacheable.
  EXPECT_NE(plain->WhyNotCacheable().value_or("").find("random_resized_crop"), std::string::npos);
  auto center = params;
  center["crop"] = std::string("center");
  center["flip"] = 0.0;
  EXPECT_FALSE(MakeStage("image", "image", center)->WhyNotCacheable().has_value());
  EXPECT_EQ(MakeStage("image", "image", center)->CacheEntryBytes(), 96.0 * 64 * 3 * 4);
  for (const char* name : {"photo00.jpg", "photo00_progressive.jpg", "photo01_gray.jpg",
                           "photo02.png", "photo07.jpg", "photo13.jpg"}) {
    const FieldValue in = PathField(TestData(std::string("photos/") + name));
    OneSampleMemo memo;
    std::unique_ptr<StageWorker> worker = cached->NewWorker();
    for (uint32_t epoch = 0; epoch < 4; ++epoch) {
      Result<Output> want = RunImage(*plain, in, name, epoch);
      ASSERT_TRUE(want.ok()) << want.status().message();
      std::vector<uint8_t> got(want->data.size());
      uint8_t* ptr = got.data();
      SampleContext ctx{42, epoch, name, "test"};
      ctx.memo = &memo;
      ASSERT_TRUE(worker->Process(ctx, in, OutputRow(&ptr, 1)).ok());
      int differ = 0, most = 0;
      for (size_t i = 0; i < got.size(); i += 4) {
        float a, b;
        std::memcpy(&a, &got[i], 4);
        std::memcpy(&b, &want->data[i], 4);
        if (a != b) ++differ;
        most = std::max(most, static_cast<int>(std::lround(std::abs(a - b) * 255 * 0.225)));
      }
      EXPECT_EQ(got, want->data) << name << ", epoch " << epoch << ": " << differ << " of "
                                 << got.size() / 4 << " differ, most " << most;
      ASSERT_NE(memo.kept, nullptr);
    }
    cv::Mat whole = cv::imread(in.data, cv::IMREAD_COLOR);
    EXPECT_EQ(memo.kept->size(), 8u + whole.total() * 3) << name;
  }
}

TEST(ImageStageTest, RandomCropIsSeededBySampleAndEpoch) {
  auto stage = MakeStage(
      "image", "image",
      {{"crop", std::string("random_resized_crop")}, {"size", std::vector<int64_t>{64, 64}}});
  FieldValue f = PathField(TestData("photos/photo03.jpg"));
  Result<Output> a = RunImage(*stage, f, "id1"), b = RunImage(*stage, f, "id1"),
                 c = RunImage(*stage, f, "id2"), d = RunImage(*stage, f, "id1", 1);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok() && d.ok());
  EXPECT_EQ(a->data, b->data);
  EXPECT_NE(a->data, c->data);
  EXPECT_NE(a->data, d->data);
}

TEST(ImageStageTest, FlipMirrorsAndFloatNormalizeMatchesPixels) {
  std::map<std::string, ParamValue> base = {{"crop", std::string("center")},
                                            {"size", std::vector<int64_t>{40, 60}}};
  auto plain = MakeStage("image", "image", base);
  auto with_flip = base;
  with_flip["flip"] = 1.0;
  auto flipped = MakeStage("image", "image", with_flip);
  auto with_norm = base;
  with_norm["dtype"] = std::string("float32");
  with_norm["layout"] = std::string("CHW");
  with_norm["mean"] = std::vector<double>{0.485, 0.456, 0.406};
  with_norm["std"] = std::vector<double>{0.229, 0.224, 0.225};
  auto normalized = MakeStage("image", "image", with_norm);
  FieldValue f = PathField(TestData("photos/photo07.jpg"));
  Result<Output> p = RunImage(*plain, f), q = RunImage(*flipped, f), n = RunImage(*normalized, f);
  ASSERT_TRUE(p.ok() && q.ok() && n.ok());
  const int H = 40, W = 60;
  const double mean[3] = {0.485, 0.456, 0.406}, sd[3] = {0.229, 0.224, 0.225};
  ASSERT_EQ(n->spec.shape, (std::vector<int64_t>{3, H, W}));
  const float* nf = n->As<float>();
  for (int y = 0; y < H; ++y)
    for (int x = 0; x < W; ++x)
      for (int c = 0; c < 3; ++c) {
        uint8_t v = p->data[(y * W + x) * 3 + c];
        ASSERT_EQ(v, q->data[(y * W + (W - 1 - x)) * 3 + c]);
        ASSERT_NEAR(nf[(c * H + y) * W + x], (v / 255.0 - mean[c]) / sd[c], 1e-5);
      }
}

TEST(BFloat16Test, RoundsToTheNearestEvenLikeTorch) {
  auto bits = [](uint32_t b) {
    float f;
    std::memcpy(&f, &b, sizeof f);
    return ToBFloat16(f);
  };
  EXPECT_EQ(ToBFloat16(1.0f), 0x3f80);
  EXPECT_EQ(ToBFloat16(-2.0f), 0xc000);
  EXPECT_EQ(bits(0x3f808000), 0x3f80);           // a tie rounds to the even neighbour: down
  EXPECT_EQ(bits(0x3f818000), 0x3f82);           // and up
  EXPECT_EQ(bits(0x3f808001), 0x3f81);           // above the tie: up
  EXPECT_EQ(bits(0x7f7fffff), 0x7f80);           // the largest float rounds to infinity
  EXPECT_EQ(bits(0x7f800000), 0x7f80);           // infinity stays
  EXPECT_EQ(bits(0x7f800001) & 0x7fc0, 0x7fc0);  // a NaN stays a quiet NaN
}

// dtype: bfloat16 is the float32 output rounded, in every layout.
TEST(ImageStageTest, BFloat16IsTheFloat32OutputRounded) {
  for (const char* layout : {"CHW", "HWC"}) {
    std::map<std::string, ParamValue> p = {{"crop", std::string("center")},
                                           {"size", std::vector<int64_t>{40, 60}},
                                           {"layout", std::string(layout)},
                                           {"mean", std::vector<double>{0.5, 0.5, 0.5}},
                                           {"std", std::vector<double>{0.5, 0.5, 0.5}},
                                           {"dtype", std::string("float32")}};
    auto f32 = MakeStage("image", "image", p);
    p["dtype"] = std::string("bfloat16");
    auto bf16 = MakeStage("image", "image", p);
    FieldValue f = PathField(TestData("photos/photo07.jpg"));
    Result<Output> a = RunImage(*f32, f), b = RunImage(*bf16, f);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(b->spec.dtype, DType::kBFloat16);
    EXPECT_EQ(b->spec.shape, a->spec.shape);
    ASSERT_EQ(b->data.size() * 2, a->data.size());
    const float* x = a->As<float>();
    const uint16_t* y = b->As<uint16_t>();
    for (size_t i = 0; i < 40 * 60 * 3; ++i)
      ASSERT_EQ(y[i], ToBFloat16(x[i])) << layout << " " << i;
  }
}

TEST(ImageStageTest, GrayscaleProgressiveAndPngDecode) {
  auto stage = MakeStage("image", "image",
                         {{"crop", std::string("center")}, {"size", std::vector<int64_t>{50, 50}}});
  Result<Output> gray = RunImage(*stage, PathField(TestData("photos/photo01_gray.jpg")));
  ASSERT_TRUE(gray.ok()) << gray.status().message();
  for (int i = 0; i < 50 * 50; ++i) {
    ASSERT_EQ(gray->data[3 * i], gray->data[3 * i + 1]);
    ASSERT_EQ(gray->data[3 * i], gray->data[3 * i + 2]);
  }
  EXPECT_TRUE(RunImage(*stage, PathField(TestData("photos/photo00_progressive.jpg"))).ok());
  Result<Output> png = RunImage(*stage, PathField(TestData("photos/photo02.png")));
  ASSERT_TRUE(png.ok()) << png.status().message();
  Result<Output> jpg = RunImage(*stage, PathField(TestData("photos/photo02.jpg")));
  ASSERT_TRUE(jpg.ok());
  cv::Mat a(50, 50, CV_8UC3, png->data.data()), b(50, 50, CV_8UC3, jpg->data.data());
  EXPECT_LT(cv::norm(a, b, cv::NORM_L1) / (50.0 * 50 * 3), 12.0)
      << "PNG and JPEG of one photo must agree";
}

TEST(ImageStageTest, HugeDeclaredSizeIsRefusedBeforeDecoding) {
  auto stage = MakeStage("image", "image", {{"size", std::vector<int64_t>{32, 32}}});
  FieldValue f;
  f.kind = FieldValue::Kind::kBytes;
  f.data = testing::PatchJpegSize(testing::ReadFile(TestData("photos/photo00.jpg")), 60000, 60000);
  Result<Output> t = RunImage(*stage, f);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), Status::Code::kTooLarge);
  EXPECT_NE(t.status().message().find("60000x60000 = 3600000000 pixels, above max_pixels 89478485"),
            std::string::npos);
  auto strict = MakeStage("image", "image",
                          {{"size", std::vector<int64_t>{32, 32}}, {"max_pixels", int64_t{1000}}});
  EXPECT_EQ(RunImage(*strict, PathField(TestData("photos/photo00.jpg"))).status().code(),
            Status::Code::kTooLarge);
}

// Decodes `region` at `scale`/8 row by row into a Mat (window of one row).
cv::Mat DecodeRows(JpegDecoder& dec, const std::string& jpeg, int scale, const cv::Rect& region) {
  EXPECT_TRUE(dec.Start(jpeg, scale, region, 1).ok());
  cv::Mat out(region.height, dec.width(), CV_8UC3);
  for (int y = 0; y < region.height; ++y) {
    const uint8_t* row = dec.Row(region.y + y);
    EXPECT_NE(row, nullptr) << dec.status().message();
    if (!row) break;
    std::memcpy(out.ptr<uint8_t>(y), row, static_cast<size_t>(dec.width()) * 3);
  }
  dec.End();
  return out;
}

TEST(ImageStageTest, RegionDecodeReadsOnlyTheRowsAndColumnsNeeded) {
  std::string jpeg = testing::ReadFile(TestData("photos/photo05.jpg"));
  JpegDecoder dec;
  int w, h;
  ASSERT_TRUE(dec.ReadSize(jpeg, &w, &h).ok());
  const int sw = JpegDecoder::ScaledSize(w, 4), sh = JpegDecoder::ScaledSize(h, 4);
  cv::Rect want(sw / 2, sh / 3, sw / 4, sh / 5);
  cv::Mat region = DecodeRows(dec, jpeg, 4, want);
  EXPECT_LT(region.cols, sw / 4 + 32)
      << "columns outside the region (plus iMCU rounding) are not decoded";
  const int x0 = dec.x0();
  EXPECT_LE(x0, want.x);
  EXPECT_GE(x0 + region.cols, want.x + want.width);
  // The decoded region has the pixels of a full half-scale decode.
  cv::Mat full = DecodeRows(dec, jpeg, 4, cv::Rect(0, 0, sw, sh));
  ASSERT_EQ(full.size(), cv::Size(sw, sh));
  cv::Rect in_region(want.x - x0, 0, want.width, want.height);
  double diff = cv::norm(region(in_region), full(want), cv::NORM_L1) / (want.area() * 3.0);
  EXPECT_LT(diff, 0.5);
}

// A region's pixels are exactly a full decode's, wherever it starts (on an iMCU boundary too,
// where a crop's fancy upsampling lacked the chroma to its left) and at every DCT scale.
TEST(ImageStageTest, ARegionDecodeHasTheFullDecodesPixels) {
  JpegDecoder dec;
  std::mt19937 rng(7);
  for (const char* name : {"photo00.jpg", "photo00_progressive.jpg", "photo01_gray.jpg",
                           "photo07.jpg", "photo13.jpg"}) {
    const std::string jpeg = testing::ReadFile(TestData(std::string("photos/") + name));
    int w, h;
    ASSERT_TRUE(dec.ReadSize(jpeg, &w, &h).ok());
    for (int scale : {8, 4}) {
      const int sw = JpegDecoder::ScaledSize(w, scale), sh = JpegDecoder::ScaledSize(h, scale);
      const cv::Mat full = DecodeRows(dec, jpeg, scale, cv::Rect(0, 0, sw, sh));
      for (int k = 0; k < 40; ++k) {
        cv::Rect r;
        r.x = static_cast<int>(rng() % (sw - 8));
        if (k % 2) r.x -= r.x % 16;  // on an iMCU boundary
        r.y = static_cast<int>(rng() % (sh - 8));
        r.width = 1 + static_cast<int>(rng() % (sw - r.x));
        r.height = 1 + static_cast<int>(rng() % (sh - r.y));
        const cv::Mat region = DecodeRows(dec, jpeg, scale, r);
        const cv::Mat got = region(cv::Rect(r.x - dec.x0(), 0, r.width, r.height));
        ASSERT_EQ(cv::norm(got, full(r), cv::NORM_INF), 0)
            << name << " at " << scale << "/8, region " << r;
      }
    }
  }
}

// Rows come from a window of the last rows decoded; the rows below the last one asked for are
// never decoded: a file cut short below the region decodes, and fails only when its missing
// rows are asked for.
TEST(ImageStageTest, RowsAreDecodedAsAskedIntoAWindow) {
  std::string jpeg = testing::ReadFile(TestData("photos/photo05.jpg"));
  JpegDecoder dec;
  int w, h;
  ASSERT_TRUE(dec.ReadSize(jpeg, &w, &h).ok());
  ASSERT_TRUE(dec.Start(jpeg, 8, cv::Rect(0, 0, w, h), 3).ok());
  ASSERT_NE(dec.Row(5), nullptr);
  ASSERT_NE(dec.Row(3), nullptr) << "rows 3..5 are in the window";
  EXPECT_EQ(dec.Row(2), nullptr) << "row 2 left the window";
  EXPECT_EQ(dec.status().code(), Status::Code::kInvalid);
  dec.End();

  std::string cut = jpeg.substr(0, jpeg.size() / 2);
  ASSERT_TRUE(dec.Start(cut, 8, cv::Rect(0, 0, w, h), 4).ok());
  for (int y = 0; y < h / 8; ++y) ASSERT_NE(dec.Row(y), nullptr) << y << dec.status().message();
  EXPECT_EQ(dec.Row(h - 1), nullptr);
  EXPECT_EQ(dec.status().code(), Status::Code::kCorrupt);
  EXPECT_NE(dec.status().message().find("JPEG decode"), std::string::npos);
  // The decoder is ready for the next image.
  cv::Mat again = DecodeRows(dec, jpeg, 8, cv::Rect(0, 0, w, 16));
  EXPECT_EQ(again.rows, 16);
}

// A window of a resize is exactly those pixels of the whole resize: Resize(256) then
// CenterCrop(224) can read only the pixels the crop needs.
TEST(ImageStageTest, AResizeWindowEqualsTheCropOfTheWholeResize) {
  cv::Mat src(97, 131, CV_8UC3);
  cv::randu(src, 0, 256);
  Resampler whole, window;
  const AxisMap wx{0, 131.0 / 70, 0, 131, 0, 70}, wy{0, 97.0 / 52, 0, 97, 0, 52};
  whole.Plan(wx, wy);
  std::vector<uint8_t> all(70 * 52 * 3), part(30 * 20 * 3);
  whole.Run(src, {0, 0}, {}, all.data());
  AxisMap px = wx, py = wy;
  px.start = 17;
  px.count = 30;
  py.start = 11;
  py.count = 20;
  cv::Rect need = window.Plan(px, py);
  EXPECT_GT(need.x, 0);
  EXPECT_LT(need.width, 131);
  cv::Mat only = src(need).clone();  // nothing outside what Plan asked for
  window.Run(only, need.tl(), {}, part.data());
  for (int y = 0; y < 20; ++y)
    for (int x = 0; x < 30 * 3; ++x)
      ASSERT_EQ(part[y * 90 + x], all[(y + 11) * 210 + 17 * 3 + x]) << y << "," << x;
}

// The AVX2 kernels give the portable code's bytes: shrinking and enlarging (few and many taps,
// bilinear and bicubic), windows, odd widths, flips, every dtype and layout, and JPEG rows.
TEST(ImageStageTest, Avx2AndPortableKernelsGiveTheSameBytes) {
  cv::Mat src(301, 517, CV_8UC3);
  cv::randu(src, 0, 256);
  // Red as pixel + 0.5: from 128 on every value is a bfloat16 tie (rounded to even).
  const float mul[3] = {1.0f, 0.0175f, 0.0174f}, add[3] = {0.5f, -2.03f, -1.8f};
  struct Case {
    int out_w, out_h, start_x, count_x;
    Filter filter;
  };
  // From one horizontal tap pair per output (upscales, unrolled) to about fifteen (14x, looped).
  for (const Case& c :
       {Case{224, 224, 0, 224, Filter::kBilinear},
        Case{37, 29, 0, 37, Filter::kBilinear},  // 14x: many taps
        Case{700, 451, 13, 601, Filter::kBilinear}, Case{333, 97, 0, 333, Filter::kBicubic},
        Case{1031, 600, 0, 1031, Filter::kBicubic}})
    for (DType dtype : {DType::kUInt8, DType::kFloat32, DType::kBFloat16})
      for (bool chw : {false, true})
        for (bool flip : {false, true}) {
          AxisMap x{0, 517.0 / c.out_w, 0, 517, c.start_x, c.count_x},
              y{0, 301.0 / c.out_h, 0, 301, 0, c.out_h};
          ResampleOutput o;
          o.dtype = dtype;
          o.chw = chw;
          o.flip = flip;
          if (dtype != DType::kUInt8) {  // as the Qwen stages call it: uint8 output, no factors
            o.mul = mul;
            o.add = add;
          }
          const size_t bytes = static_cast<size_t>(c.count_x) * c.out_h * 3 * DTypeSize(dtype);
          std::vector<uint8_t> fast(bytes), portable(bytes);
          Resampler r;
          const cv::Rect need = r.Plan(x, y, c.filter);
          r.Run(src(need).clone(), need.tl(), o, fast.data());
          UsePortableKernels(true);
          r.Run(src(need).clone(), need.tl(), o, portable.data());
          UsePortableKernels(false);
          ASSERT_EQ(fast, portable) << c.out_w << "x" << c.out_h << " " << DTypeName(dtype)
                                    << (chw ? " CHW" : " HWC") << (flip ? " flipped" : "");
        }
  // Rows straight from the JPEG decoder (its padding lets the wide loads reach the last columns).
  auto stage = MakeStage("image", "image",
                         {{"crop", std::string("random_resized_crop")},
                          {"size", std::vector<int64_t>{224, 224}},
                          {"flip", 0.5},
                          {"dtype", std::string("float32")},
                          {"layout", std::string("CHW")}});
  for (const char* name : {"photo01.jpg", "photo04.jpg", "photo00_progressive.jpg"})
    for (const char* id : {"a", "b", "c", "d"}) {
      FieldValue f = PathField(TestData(std::string("photos/") + name));
      Result<Output> fast = RunImage(*stage, f, id);
      UsePortableKernels(true);
      Result<Output> portable = RunImage(*stage, f, id);
      UsePortableKernels(false);
      ASSERT_TRUE(fast.ok() && portable.ok());
      ASSERT_EQ(fast->data, portable->data) << name << " " << id;
    }
}

}  // namespace
}  // namespace mmfeed
