// The qwen_video stage's arithmetic against the reference's (Hugging Face's
// Qwen3VLVideoProcessor: its smart_resize and sample_frames, values computed with the Python
// definitions), and the stage on videos made here with ffmpeg. Pixels against a PyAV + PIL
// reference: tests/integration/qwen_fidelity_test.py.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "stages/common/qwen_patches.h"
#include "tests/stage_util.h"
#include "tests/test_util.h"

namespace mmfeed {
namespace {

using testing::MakeStage;
using testing::Output;
using testing::PathField;

TEST(QwenVideoTest, SmartResizeIsTheReferences) {
  // (frames, height, width) with min 128*32*32, max 768*32*32 -> the reference's size.
  struct Case {
    int64_t n, h, w, want_h, want_w;
  } cases[] = {
      {4, 120, 160, 160, 224},    // grows to min_pixels
      {8, 720, 1280, 224, 416},   // shrinks over all 8 frames
      {5, 1080, 1920, 288, 512},  // 5 frames count as round(5 / 2) * 2 = 4 for the check
      {768, 1080, 1920, 32, 32},  // every frame down to one merge window
      {3, 480, 640, 416, 576},    // 3 frames: 4 for the check, beta over 3
      {16, 10, 300, 32, 960},     // a side below 32 grows to 32 first (int() of the scale)
      {4, 240, 320, 256, 320},    // fits as rounded
      {2, 64, 64, 256, 256},      // two frames: grows
      {100, 360, 640, 64, 96},    //
      {9, 17, 23, 128, 160},      // both sides below 32
  };
  for (const Case& c : cases) {
    Result<QwenSize> s = QwenVideoSmartResize(c.n, c.h, c.w, 2, 32, 131072, 786432);
    ASSERT_TRUE(s.ok()) << s.status().message();
    EXPECT_EQ(s->height, c.want_h) << c.n << " x " << c.h << "x" << c.w;
    EXPECT_EQ(s->width, c.want_w) << c.n << " x " << c.h << "x" << c.w;
  }
  Result<QwenSize> one = QwenVideoSmartResize(1, 120, 160, 2, 32, 131072, 786432);
  ASSERT_FALSE(one.ok());
  EXPECT_NE(one.status().message().find("1 frame(s) sampled"), std::string::npos);
  EXPECT_FALSE(QwenVideoSmartResize(4, 10, 2100, 2, 32, 131072, 786432).ok()) << "ratio 210";
}

TEST(QwenVideoTest, FrameIndicesAreTheReferences) {
  // np.linspace(0, total - 1, n).round() with n = int(total / fps_src * fps) clamped.
  EXPECT_EQ(QwenVideoFrameIndices(100, 25, 2, 4, 768),
            (std::vector<int64_t>{0, 14, 28, 42, 57, 71, 85, 99}));
  EXPECT_EQ(QwenVideoFrameIndices(3, 25, 2, 4, 768), (std::vector<int64_t>{0, 1, 2}))
      << "no more than the video has";
  EXPECT_EQ(QwenVideoFrameIndices(7, 25, 2, 4, 768), (std::vector<int64_t>{0, 2, 4, 6}))
      << "at least min_frames";
  EXPECT_EQ(QwenVideoFrameIndices(120, 24, 2.5, 4, 768),
            (std::vector<int64_t>{0, 11, 22, 32, 43, 54, 65, 76, 87, 97, 108, 119}));
  std::vector<int64_t> ntsc = QwenVideoFrameIndices(250, 30000.0 / 1001, 2, 4, 768);
  ASSERT_EQ(ntsc.size(), 16u);
  EXPECT_EQ(std::vector<int64_t>(ntsc.begin(), ntsc.begin() + 6),
            (std::vector<int64_t>{0, 17, 33, 50, 66, 83}));
  std::vector<int64_t> many = QwenVideoFrameIndices(10000, 25, 2, 4, 768);
  ASSERT_EQ(many.size(), 768u) << "at most max_frames";
  EXPECT_EQ(many[1], 13);
  EXPECT_EQ(many.back(), 9999);
  EXPECT_TRUE(QwenVideoFrameIndices(0, 25, 2, 4, 768).empty());
  EXPECT_EQ(QwenVideoFrameIndices(1000, 1e-300, 2, 4, 768).size(), 768u)
      << "a container declaring an absurd rate: at most max_frames, no overflow";
}

class QwenVideoStageTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    auto ffmpeg = [](const std::string& args) {
      const std::string cmd = "ffmpeg -v error -y " + args;
      ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    };
    // 4 s of one colour; 3 moving frames; a single frame.
    ffmpeg("-f lavfi -i color=c=0x3264C8:size=320x240:rate=25 -t 4 -c:v libx264 -pix_fmt yuv444p " +
           Path("flat.mp4"));
    ffmpeg("-f lavfi -i testsrc2=size=320x240:rate=25 -frames:v 3 -c:v libx264 -pix_fmt yuv420p " +
           Path("three.mp4"));
    ffmpeg("-f lavfi -i testsrc2=size=320x240:rate=25 -frames:v 1 -c:v libx264 -pix_fmt yuv420p " +
           Path("one.mp4"));
    // 4 s with its index first, then cut at 60%; and with its middle overwritten.
    ffmpeg(
        "-f lavfi -i testsrc2=size=320x240:rate=25 -t 4 -c:v libx264 -g 25 -pix_fmt yuv420p "
        "-movflags +faststart " +
        Path("good.mp4"));
    const std::string good = testing::ReadFile(Path("good.mp4"));
    testing::WriteFile(Path("cut.mp4"), good.substr(0, good.size() * 6 / 10));
    std::string corrupt = good;
    const size_t mdat = good.find("mdat"), mid = mdat + (good.size() - mdat) / 2;
    for (size_t k = mid; k < mid + 2000; ++k) corrupt[k] = static_cast<char>(k * 7919);
    testing::WriteFile(Path("corrupt.mp4"), corrupt);
    testing::WriteFile(Path("text.mp4"), std::string(500, 'x'));
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static std::string Path(const std::string& name) { return *dir_ / name; }
  static testing::TempDir* dir_;
};
testing::TempDir* QwenVideoStageTest::dir_ = nullptr;

TEST_F(QwenVideoStageTest, OutputsPatchesGridAndTimesOfTheSampledFrames) {
  auto stage = MakeStage("qwen_video", "pixel_values_videos", {});
  ASSERT_TRUE(stage);
  std::vector<TensorSpec> specs = stage->OutputSpecs();
  ASSERT_EQ(specs.size(), 4u);
  EXPECT_EQ(specs[0].shape, (std::vector<int64_t>{3072, 1536})) << "786432 / 16^2 rows";
  EXPECT_EQ(specs[0].rows_from, "video_grid_thw");
  EXPECT_EQ(specs[1].name, "video_grid_thw");
  EXPECT_EQ(specs[1].rows_from, "video_grid_thw_count");
  EXPECT_EQ(specs[3].name, "video_grid_thw_seconds");
  EXPECT_EQ(specs[3].shape, (std::vector<int64_t>{1, 384}));

  // 100 frames at 25 fps, 2 fps: 8 frames, [0, 14, 28, 42, 57, 71, 85, 99]; smart_resize(8,
  // 240, 320) = (256, 320): grid (4, 16, 20).
  Result<std::vector<Output>> out =
      testing::RunStage(*stage, {1, 0, "x", "test"}, PathField(Path("flat.mp4")));
  ASSERT_TRUE(out.ok()) << out.status().message();
  const int32_t* grid = (*out)[1].As<int32_t>();
  EXPECT_EQ(std::vector<int32_t>(grid, grid + 3), (std::vector<int32_t>{4, 16, 20}));
  EXPECT_EQ(*(*out)[2].As<int32_t>(), 1);
  const float* seconds = (*out)[3].As<float>();
  // (0 + 14) / 25 / 2 = 0.28 -> 0.3; (28 + 42) / 50 = 1.4; (57 + 71) / 50 = 2.56 -> 2.6; 3.68
  EXPECT_EQ(std::vector<float>(seconds, seconds + 5),
            (std::vector<float>{0.3f, 1.4f, 2.6f, 3.7f, 0.0f}));
  // One colour: the bicubic of a constant is the constant, so each channel is one value.
  const float* v = (*out)[0].As<float>();
  for (int r = 0; r < 4 * 16 * 20; ++r)
    for (int col = 0; col < 1536; ++col)
      ASSERT_EQ(v[r * 1536 + col], v[col / 512 * 512]) << r << " " << col;
  EXPECT_NEAR(v[0], 0x32 / 127.5 - 1, 0.02);
  EXPECT_NEAR(v[512], 0x64 / 127.5 - 1, 0.02);
  EXPECT_NEAR(v[1024], 0xC8 / 127.5 - 1, 0.02);
}

TEST_F(QwenVideoStageTest, AnOddFrameCountRepeatsTheLastFrame) {
  auto stage = MakeStage("qwen_video", "pixel_values_videos", {});
  Result<std::vector<Output>> out =
      testing::RunStage(*stage, {1, 0, "x", "test"}, PathField(Path("three.mp4")));
  ASSERT_TRUE(out.ok()) << out.status().message();
  // 3 frames: smart_resize(3, 240, 320) = (256, 320), two temporal patches, the second of
  // frame 2 twice.
  const int32_t* grid = (*out)[1].As<int32_t>();
  ASSERT_EQ(std::vector<int32_t>(grid, grid + 3), (std::vector<int32_t>{2, 16, 20}));
  const float* seconds = (*out)[3].As<float>();
  EXPECT_EQ(seconds[0], 0.0f);  // (0 + 0.04) / 2
  EXPECT_EQ(seconds[1], 0.1f);  // (0.08 + 0.08) / 2
  const float* v = (*out)[0].As<float>();
  const int rows = 16 * 20;
  bool first_differs = false;
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < 3; ++c)
      for (int k = 0; k < 256; ++k) {
        const size_t at = static_cast<size_t>(r) * 1536 + c * 512 + k;
        first_differs |= v[at] != v[at + 256];  // frames 0 and 1 (testsrc2 moves)
        ASSERT_EQ(v[rows * 1536 + at], v[rows * 1536 + at + 256]) << "frame 2 twice";
      }
  EXPECT_TRUE(first_differs);

  Result<std::vector<Output>> one =
      testing::RunStage(*stage, {1, 0, "x", "test"}, PathField(Path("one.mp4")));
  ASSERT_FALSE(one.ok());
  EXPECT_NE(one.status().message().find("1 frame(s) sampled"), std::string::npos)
      << one.status().message();
  EXPECT_FALSE(testing::RunStage(*stage, {1, 0, "x", "test"}, PathField(Path("missing.mp4"))).ok());
}

TEST_F(QwenVideoStageTest, ASampleMayListSeveralVideosOrNone) {
  auto stage = MakeStage("qwen_video", "pixel_values_videos",
                         {{"max_videos", int64_t{2}}, {"cu_seqlens", std::string("video_cu")}});
  ASSERT_TRUE(stage);
  EXPECT_EQ(stage->OutputSpecs()[0].shape, (std::vector<int64_t>{2 * 3072, 1536}));
  EXPECT_EQ(stage->OutputSpecs()[3].shape, (std::vector<int64_t>{2, 384}));
  // Filled when the batch is committed: a temporal patch of a video is a sequence.
  EXPECT_EQ(stage->OutputSpecs()[4].name, "video_cu");
  EXPECT_EQ(stage->OutputSpecs()[4].shape, (std::vector<int64_t>{2 * 384 + 1}));
  EXPECT_EQ(stage->OutputSpecs()[4].starts_of, "video_grid_thw");
  FieldValue list;
  list.kind = FieldValue::Kind::kList;
  list.items = {PathField(Path("three.mp4")), PathField(Path("flat.mp4"))};
  Result<std::vector<Output>> out = testing::RunStage(*stage, {1, 0, "x", "test"}, list);
  ASSERT_TRUE(out.ok()) << out.status().message();
  const int32_t* grid = (*out)[1].As<int32_t>();
  EXPECT_EQ(std::vector<int32_t>(grid, grid + 6), (std::vector<int32_t>{2, 16, 20, 4, 16, 20}));
  EXPECT_EQ(*(*out)[2].As<int32_t>(), 2);
  const float* seconds = (*out)[3].As<float>();
  EXPECT_EQ(seconds[1], 0.1f) << "the first video's";
  EXPECT_EQ(seconds[384 + 3], 3.7f) << "the second video's, on its own row";
  const float* v = (*out)[0].As<float>();
  EXPECT_EQ(v[2 * 320 * 1536], v[2 * 320 * 1536 + 1535 - 1024]) << "the flat video follows at once";

  list.items.clear();  // "videos": [] (a sample without video)
  Result<std::vector<Output>> none = testing::RunStage(*stage, {1, 0, "x", "test"}, list);
  ASSERT_TRUE(none.ok()) << none.status().message();
  EXPECT_EQ(*(*none)[2].As<int32_t>(), 0);
  grid = (*none)[1].As<int32_t>();
  EXPECT_EQ(std::vector<int32_t>(grid, grid + 6), std::vector<int32_t>(6, 0));

  list.items = {PathField(Path("flat.mp4")), PathField(Path("flat.mp4")), PathField(Path("x.mp4"))};
  Result<std::vector<Output>> many = testing::RunStage(*stage, {1, 0, "x", "test"}, list);
  ASSERT_FALSE(many.ok());
  EXPECT_NE(many.status().message().find("3 videos, above max_videos 2"), std::string::npos);
  list.items = {PathField(Path("flat.mp4")), PathField(Path("one.mp4"))};
  Result<std::vector<Output>> bad = testing::RunStage(*stage, {1, 0, "x", "test"}, list);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("video 2 of 2"), std::string::npos)
      << bad.status().message();
}

// What token-budget batches count: measuring a sample (its streams opened, no frame decoded)
// gives the grids, counts and times that processing it gives, and the same errors.
TEST_F(QwenVideoStageTest, MeasuringGivesTheGridsAndTimesOfProcessing) {
  auto stage = MakeStage("qwen_video", "pixel_values_videos", {{"max_videos", int64_t{2}}});
  ASSERT_TRUE(stage);
  EXPECT_EQ(stage->Costs().patches, "pixel_values_videos");
  EXPECT_EQ(stage->Costs().tokens, "");
  FieldValue list;
  list.kind = FieldValue::Kind::kList;
  list.items = {PathField(Path("three.mp4")), PathField(Path("good.mp4"))};
  Result<std::vector<Output>> run = testing::RunStage(*stage, {1, 0, "x", "test"}, list);
  Result<std::vector<Output>> measured = testing::MeasureStage(*stage, {1, 0, "x", "test"}, list);
  ASSERT_TRUE(run.ok() && measured.ok()) << measured.status().message();
  EXPECT_TRUE((*measured)[0].data.empty());
  for (size_t k = 1; k < 4; ++k) EXPECT_EQ((*measured)[k].data, (*run)[k].data) << k;
  for (const char* bad : {"one.mp4", "text.mp4", "missing.mp4"}) {
    list.items = {PathField(Path(bad))};
    EXPECT_FALSE(testing::MeasureStage(*stage, {1, 0, "x", "test"}, list).ok()) << bad;
  }
}

// The chat stage on grids and times handed to it directly: Qwen3-VL's blocks per temporal
// patch, and a grid whose temporal patch is not whole merge windows refused.
TEST(QwenChatVideoTest, TimedBlocksPerTemporalPatchAndBadGridsRefused) {
  auto chat = MakeStage("qwen_chat", "input_ids",
                        {{"tokenizer", testing::TestData("tokenizer/qwen3-tokenizer.json.gz")},
                         {"template", std::string("{video}{text}")},
                         {"image_grid", std::string("")},
                         {"video_grid", std::string("video_grid_thw")},
                         {"video_seconds", std::string("video_grid_thw_seconds")},
                         {"max_len", int64_t{64}}});
  ASSERT_TRUE(chat);
  const TensorSpec grid_spec{"video_grid_thw", DType::kInt32, {1, 3}};
  const TensorSpec seconds_spec{"video_grid_thw_seconds", DType::kFloat32, {1, 4}};
  const TensorSpec* specs[2] = {&grid_spec, &seconds_spec};
  int32_t grid[3] = {2, 2, 4};  // two temporal patches of 2 merged patches each
  float seconds[4] = {0.5f, 1.5f, 0, 0};
  const uint8_t* tensors[2] = {reinterpret_cast<uint8_t*>(grid),
                               reinterpret_cast<uint8_t*>(seconds)};
  SampleContext ctx{1, 0, "x", "test"};
  ctx.tensors = tensors;
  ctx.tensor_specs = specs;
  FieldValue text;
  text.kind = FieldValue::Kind::kText;
  text.data = "hi";
  Result<std::vector<Output>> out = testing::RunStage(*chat, ctx, text);
  ASSERT_TRUE(out.ok()) << out.status().message();
  const int32_t* ids = (*out)[0].As<int32_t>();
  const std::vector<int32_t> got(ids, ids + *(*out)[1].As<int32_t>());
  EXPECT_EQ(std::count(got.begin(), got.end(), 151652), 2) << "a <|vision_start|> per patch";
  EXPECT_EQ(std::count(got.begin(), got.end(), 151656), 4) << "2 pads each";
  const int32_t wrong[3] = {2, 1, 2};  // t*h*w = 4, but a temporal patch holds 2 patches
  std::memcpy(grid, wrong, sizeof grid);
  Result<std::vector<Output>> bad = testing::RunStage(*chat, ctx, text);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("a temporal patch is not whole merge windows"),
            std::string::npos)
      << bad.status().message();
}

TEST_F(QwenVideoStageTest, DamagedVideosAreClearPerSampleErrors) {
  auto stage = MakeStage("qwen_video", "pixel_values_videos", {});
  ASSERT_TRUE(testing::RunStage(*stage, {1, 0, "x", "test"}, PathField(Path("good.mp4"))).ok());
  struct Case {
    const char* file;
    const char* says;
  } cases[] = {
      {"cut.mp4", "truncated"},
      {"corrupt.mp4", "damaged"},
      {"text.mp4", "not a readable video"},
  };
  for (const Case& c : cases) {
    Result<std::vector<Output>> out =
        testing::RunStage(*stage, {1, 0, "x", "test"}, PathField(Path(c.file)));
    ASSERT_FALSE(out.ok()) << c.file;
    EXPECT_NE(out.status().message().find(c.says), std::string::npos)
        << c.file << ": " << out.status().message();
  }
}

TEST_F(QwenVideoStageTest, BadParametersAreClearErrors) {
  auto make = [&](const std::string& key, ParamValue v) {
    return testing::BuildStage("qwen_video", "pixel_values_videos", {{key, std::move(v)}}).status();
  };
  EXPECT_NE(make("max_frames", int64_t{1}).message().find("max_frames must be in 2..4096"),
            std::string::npos);
  EXPECT_NE(make("min_frames", int64_t{1000}).message().find("min_frames"), std::string::npos);
  EXPECT_NE(make("fps", 0.0).message().find("fps"), std::string::npos);
  EXPECT_NE(make("max_pixels", int64_t{100}).message().find("max_pixels must be in 2048.."),
            std::string::npos);
  EXPECT_NE(make("grid", std::string("pixel_values_videos")).message().find("grid"),
            std::string::npos);

  // The chat stage's timestamps need a {video} to stand before.
  Status s =
      testing::BuildStage("qwen_chat", "input_ids",
                          {{"tokenizer", testing::TestData("tokenizer/qwen3-tokenizer.json.gz")},
                           {"video_seconds", std::string("video_grid_thw_seconds")}})
          .status();
  EXPECT_NE(s.message().find("video_seconds is set but the template has no {video}"),
            std::string::npos)
      << s.message();
}

}  // namespace
}  // namespace mmfeed
