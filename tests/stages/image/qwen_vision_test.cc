#include <gtest/gtest.h>

#include <opencv2/imgcodecs.hpp>

#include "stages/common/qwen_patches.h"
#include "tests/stage_util.h"
#include "tests/test_util.h"

namespace mmfeed {
namespace {

using testing::MakeStage;
using testing::Output;
using testing::PathField;

TEST(QwenVisionTest, SmartResizeIsTheReferences) {
  // (height, width, min_pixels, max_pixels) -> the reference's (tests/reference/
  // qwen_vision_reference.py) size: halves round to even (48 -> 64, 80 -> 64), small images grow
  // by ceil, large ones shrink by floor, a side never below one factor.
  struct Case {
    int64_t h, w, min, max, want_h, want_w;
  } cases[] = {
      {480, 640, 65536, 16777216, 480, 640},
      {48, 80, 0, 16777216, 64, 64},
      {80, 48, 0, 16777216, 64, 64},
      {12, 20, 65536, 16777216, 224, 352},
      {1080, 1920, 65536, 262144, 384, 672},
      {4000, 3000, 65536, 16777216, 4000, 3008},
      {24, 2400, 65536, 262144, 32, 2400},
      {1900, 40, 65536, 262144, 1792, 64},
      {9000, 9000, 65536, 16777216, 4096, 4096},
      {10, 1999, 65536, 1048576, 32, 3648},
      {777, 333, 65536, 262144, 768, 320},
      {12, 300, 0, 262144, 32, 288},  // the reference's 0 for the short side: one factor
  };
  for (const Case& c : cases) {
    Result<QwenSize> s = QwenSmartResize(c.h, c.w, 32, c.min, c.max);
    ASSERT_TRUE(s.ok()) << s.status().message();
    EXPECT_EQ(s->height, c.want_h) << c.h << "x" << c.w;
    EXPECT_EQ(s->width, c.want_w) << c.h << "x" << c.w;
  }
  Result<QwenSize> wide = QwenSmartResize(10, 2010, 32, 65536, 16777216);
  EXPECT_FALSE(wide.ok());
  EXPECT_NE(wide.status().message().find("aspect ratio 201"), std::string::npos);
  EXPECT_TRUE(QwenSmartResize(10, 2000, 32, 65536, 16777216).ok()) << "200 itself is allowed";
}

TEST(QwenVisionTest, PatchesAreInTheReferencesOrder) {
  // The reference reshapes [T, C, H, W] to (t, tp, c, h/m, m, p, w/m, m, p), permutes to
  // (t, h/m, w/m, m, m, c, tp, p, p) and flattens. Each value here names its own (c, tp, y, x),
  // so every row and column can be checked against that definition.
  const int h = 64, w = 96;
  QwenPatching q;  // 16, 2, 2
  std::vector<uint8_t> chw[2] = {std::vector<uint8_t>(3 * h * w), std::vector<uint8_t>(3 * h * w)};
  float lut[3][256];
  for (int c = 0; c < 3; ++c)
    for (int v = 0; v < 256; ++v) lut[c][v] = static_cast<float>(c * 1000 + v);
  for (int t = 0; t < 2; ++t)
    for (int c = 0; c < 3; ++c)
      for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x)
          chw[t][(c * h + y) * w + x] = static_cast<uint8_t>(y * 3 + x + t * 101);
  const int gh = h / 16, gw = w / 16;
  std::vector<float> out(static_cast<size_t>(gh) * gw * 1536);
  const float* l[3] = {lut[0], lut[1], lut[2]};
  const uint8_t* frames[2] = {chw[0].data(), chw[1].data()};
  QwenPatchify(frames, h, w, q, l, DType::kFloat32, reinterpret_cast<uint8_t*>(out.data()));
  for (int r = 0; r < gh * gw; ++r) {
    const int bw_count = gw / 2;
    const int window = r / 4, in_window = r % 4;
    const int by = window / bw_count, bx = window % bw_count, my = in_window / 2,
              mx = in_window % 2;
    for (int col = 0; col < 1536; ++col) {
      const int c = col / 512, t = (col / 256) % 2, py = (col / 16) % 16, px = col % 16;
      const int y = (by * 2 + my) * 16 + py, x = (bx * 2 + mx) * 16 + px;
      ASSERT_EQ(out[static_cast<size_t>(r) * 1536 + col],
                static_cast<float>(c * 1000 + static_cast<uint8_t>(y * 3 + x + t * 101)))
          << "row " << r << " column " << col;
    }
  }
}

TEST(QwenVisionTest, AStageOutputsPatchesAndGridOfTheSmartResizedImage) {
  testing::TempDir dir;
  // A flat colour: the bicubic of a constant is the constant, so every value is exact.
  cv::Mat flat(300, 500, CV_8UC3, cv::Scalar(200, 100, 51));  // BGR
  ASSERT_TRUE(cv::imwrite(dir / "flat.png", flat));
  auto stage = MakeStage("qwen_vision", "pixel_values", {{"max_pixels", int64_t{262144}}});
  ASSERT_TRUE(stage);
  std::vector<TensorSpec> specs = stage->OutputSpecs();
  ASSERT_EQ(specs.size(), 3u);
  EXPECT_EQ(specs[0].shape, (std::vector<int64_t>{1024, 1536})) << "max_pixels / 16^2 rows";
  EXPECT_EQ(specs[0].rows_from, "image_grid_thw");
  EXPECT_EQ(specs[1].name, "image_grid_thw");
  EXPECT_EQ(specs[1].shape, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(specs[1].rows_from, "image_grid_thw_count");
  EXPECT_EQ(specs[2].name, "image_grid_thw_count");
  Result<std::vector<Output>> out =
      testing::RunStage(*stage, {1, 0, "x", "test"}, PathField(dir / "flat.png"));
  ASSERT_TRUE(out.ok()) << out.status().message();
  const int32_t* grid = (*out)[1].As<int32_t>();
  EXPECT_EQ(grid[0], 1);
  EXPECT_EQ(grid[1], 288 / 16);  // smart_resize(300, 500) = (288, 512)
  EXPECT_EQ(grid[2], 512 / 16);
  const float* v = (*out)[0].As<float>();
  const float want[3] = {51 / 127.5f - 1, 100 / 127.5f - 1, 200 / 127.5f - 1};  // RGB
  for (int r = 0; r < 18 * 32; ++r)
    for (int col = 0; col < 1536; ++col)
      ASSERT_NEAR(v[r * 1536 + col], want[col / 512], 1e-6) << r << " " << col;

  auto bf16 = MakeStage("qwen_vision", "pixel_values",
                        {{"max_pixels", int64_t{262144}}, {"dtype", std::string("bfloat16")}});
  Result<std::vector<Output>> b =
      testing::RunStage(*bf16, {1, 0, "x", "test"}, PathField(dir / "flat.png"));
  ASSERT_TRUE(b.ok());
  EXPECT_EQ((*b)[0].spec.dtype, DType::kBFloat16);
  EXPECT_EQ((*b)[0].As<uint16_t>()[0], ToBFloat16(want[0]));
}

// What token-budget batches count: measuring a sample (headers only) gives the grids and
// count processing gives, and refuses what processing refuses before decoding.
TEST(QwenVisionTest, MeasuringGivesTheGridsOfProcessing) {
  testing::TempDir dir;
  cv::imwrite(dir / "a.png", cv::Mat(300, 500, CV_8UC3, cv::Scalar(10, 20, 30)));
  cv::imwrite(dir / "b.jpg", cv::Mat(1700, 900, CV_8UC3, cv::Scalar(40, 50, 60)));
  cv::imwrite(dir / "strip.png", cv::Mat(10, 2100, CV_8UC3, cv::Scalar(1, 2, 3)));
  auto stage = MakeStage("qwen_vision", "pixel_values",
                         {{"max_pixels", int64_t{262144}}, {"max_images", int64_t{3}}});
  ASSERT_TRUE(stage);
  EXPECT_EQ(stage->Costs().patches, "pixel_values");
  FieldValue list;
  list.kind = FieldValue::Kind::kList;
  list.items = {PathField(dir / "a.png"), PathField(dir / "b.jpg")};
  Result<std::vector<Output>> run = testing::RunStage(*stage, {1, 0, "x", "test"}, list);
  Result<std::vector<Output>> measured = testing::MeasureStage(*stage, {1, 0, "x", "test"}, list);
  ASSERT_TRUE(run.ok() && measured.ok()) << measured.status().message();
  EXPECT_EQ((*measured)[1].data, (*run)[1].data);
  EXPECT_EQ((*measured)[2].data, (*run)[2].data);
  for (const char* bad : {"strip.png", "missing.png"}) {
    list.items = {PathField(dir / bad)};
    EXPECT_FALSE(testing::MeasureStage(*stage, {1, 0, "x", "test"}, list).ok()) << bad;
  }
}

TEST(QwenVisionTest, BadImagesAndParametersAreClearErrors) {
  testing::TempDir dir;
  cv::Mat strip(10, 2100, CV_8UC3, cv::Scalar(1, 2, 3));
  ASSERT_TRUE(cv::imwrite(dir / "strip.png", strip));
  testing::WriteFile(dir / "junk.jpg", "\xff\xd8\xff not a jpeg");
  auto stage = MakeStage("qwen_vision", "pixel_values", {{"max_pixels", int64_t{262144}}});
  Result<std::vector<Output>> wide =
      testing::RunStage(*stage, {1, 0, "x", "test"}, PathField(dir / "strip.png"));
  ASSERT_FALSE(wide.ok());
  EXPECT_NE(wide.status().message().find("aspect ratio 210 is above 200"), std::string::npos);
  EXPECT_FALSE(testing::RunStage(*stage, {1, 0, "x", "test"}, PathField(dir / "junk.jpg")).ok());

  auto make = [&](const std::string& key, ParamValue v) {
    return testing::BuildStage("qwen_vision", "pixel_values", {{key, std::move(v)}}).status();
  };
  EXPECT_NE(make("max_pixels", int64_t{100}).message().find("max_pixels must be in 1024.."),
            std::string::npos);
  EXPECT_NE(make("min_pixels", int64_t{1} << 25).message().find("min_pixels"), std::string::npos);
  EXPECT_NE(make("grid", std::string("pixel_values")).message().find("grid"), std::string::npos);
  EXPECT_FALSE(make("patch_size", int64_t{0}).ok());
}

TEST(QwenVisionTest, ASampleWithSeveralImagesHasEachOnesPatchesInOrder) {
  testing::TempDir dir;
  cv::imwrite(dir / "a.png", cv::Mat(300, 500, CV_8UC3, cv::Scalar(10, 20, 30)));
  cv::imwrite(dir / "b.png", cv::Mat(700, 200, CV_8UC3, cv::Scalar(40, 50, 60)));
  auto stage = MakeStage("qwen_vision", "pixel_values",
                         {{"max_pixels", int64_t{262144}}, {"max_images", int64_t{3}}});
  ASSERT_TRUE(stage);
  EXPECT_EQ(stage->OutputSpecs()[0].shape, (std::vector<int64_t>{3 * 1024, 1536}));
  EXPECT_EQ(stage->OutputSpecs()[1].shape, (std::vector<int64_t>{3, 3}));
  FieldValue list;
  list.kind = FieldValue::Kind::kList;
  list.items = {PathField(dir / "a.png"), PathField(dir / "b.png")};
  Result<std::vector<Output>> out = testing::RunStage(*stage, {1, 0, "x", "test"}, list);
  ASSERT_TRUE(out.ok()) << out.status().message();
  const int32_t* g = (*out)[1].As<int32_t>();
  // smart_resize(300, 500) = (288, 512); smart_resize(700, 200) = (704, 192)
  EXPECT_EQ(std::vector<int32_t>(g, g + 9), (std::vector<int32_t>{1, 18, 32, 1, 44, 12, 0, 0, 0}))
      << "rows past the last image are zero";
  EXPECT_EQ(*(*out)[2].As<int32_t>(), 2);
  const float* v = (*out)[0].As<float>();
  EXPECT_FLOAT_EQ(v[0], 30 / 127.5f - 1) << "the first image's red";
  EXPECT_FLOAT_EQ(v[(18 * 32 - 1) * 1536], 30 / 127.5f - 1) << "its last patch";
  EXPECT_FLOAT_EQ(v[18 * 32 * 1536], 60 / 127.5f - 1) << "the second image follows at once";
  EXPECT_FLOAT_EQ(v[(18 * 32 + 44 * 12 - 1) * 1536 + 1535], 40 / 127.5f - 1);

  list.items.push_back(PathField(dir / "a.png"));
  list.items.push_back(PathField(dir / "b.png"));
  Result<std::vector<Output>> many = testing::RunStage(*stage, {1, 0, "x", "test"}, list);
  ASSERT_FALSE(many.ok());
  EXPECT_NE(many.status().message().find("4 images, above max_images 3"), std::string::npos);
  list.items = {PathField(dir / "a.png"), PathField(dir / "missing.png")};
  Result<std::vector<Output>> missing = testing::RunStage(*stage, {1, 0, "x", "test"}, list);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("image 2 of 2"), std::string::npos)
      << missing.status().message();
  // Other stages take one value: a list is a clear per-sample error.
  auto image = MakeStage("image", "image", {{"size", std::vector<int64_t>{8, 8}}});
  Result<std::vector<Output>> one = testing::RunStage(*image, {1, 0, "x", "test"}, list);
  ASSERT_FALSE(one.ok());
  EXPECT_NE(one.status().message().find("a list of 2 values; this stage takes one"),
            std::string::npos);
}

}  // namespace
}  // namespace mmfeed
