// The video stage on media made here with Debian's ffmpeg: inputs (path, memory, tar-style
// file range), seeded clips, seeking, the keyframe index cache, padding, float output, and
// every kind of bad input as a clear per-sample error. Frame choice and pixels against a
// full-decode reference: tests/integration/video_reference_test.py.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "stages/video/video_sampler.h"
#include "tests/stage_util.h"
#include "tests/test_util.h"

namespace mmfeed {
namespace {

using testing::MakeStage;
using testing::PathField;
using testing::ReadFile;
using testing::TempDir;
using testing::WriteFile;

class VideoTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    auto ffmpeg = [](const std::string& args) {
      std::string cmd = "ffmpeg -v error -y " + args;
      ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    };
    const std::string src = "-f lavfi -i testsrc2=size=160x120:rate=25 ";
    // 4 s, a keyframe every second, B-frames; moov at the end (ffmpeg's default).
    ffmpeg(src + "-t 4 -c:v libx264 -g 25 -bf 3 -pix_fmt yuv420p " + Path("good.mp4"));
    ffmpeg("-i " + Path("good.mp4") + " -c copy -movflags +faststart " + Path("faststart.mp4"));
    // 20 s with a keyframe every second: a late clip must not decode the first 15 s.
    ffmpeg(src + "-t 20 -c:v libx264 -g 25 -preset ultrafast -pix_fmt yuv420p " + Path("long.mp4"));
    // 2 s of I B b B P (x264 always 3 B-frames, the middle one a reference: b-pyramid).
    ffmpeg(
        src +
        "-t 2 -c:v libx264 -g 250 -x264-params bframes=3:b-adapt=0:b-pyramid=strict:scenecut=0 " +
        "-pix_fmt yuv420p " + Path("pyramid.mp4"));
    ffmpeg("-f lavfi -i sine=d=1 " + Path("audio.m4a"));
    // A video track whose edit list starts after its last frame: nothing to show.
    ffmpeg("-ss 100 -i " + Path("good.mp4") + " -c copy " + Path("no_frames.mp4"));

    const std::string good = ReadFile(Path("good.mp4")), fast = ReadFile(Path("faststart.mp4"));
    WriteFile(Path("no_moov.mp4"), good.substr(0, good.size() / 2));
    WriteFile(Path("cut.mp4"), fast.substr(0, fast.size() * 6 / 10));
    std::string corrupt = fast;
    const size_t mdat = fast.find("mdat"), mid = mdat + (fast.size() - mdat) / 2;
    for (size_t k = mid; k < mid + 2000; ++k) corrupt[k] = static_cast<char>(k * 7919);
    WriteFile(Path("corrupt.mp4"), corrupt);
    // The sample entry's width and height (16-bit, 24 bytes into avc1 in stsd).
    auto patch_size = [&](int w, int h, const std::string& name) {
      std::string d = fast;
      const size_t at = d.find("avc1", d.find("stsd")) + 4 + 24;
      d[at] = static_cast<char>(w >> 8), d[at + 1] = static_cast<char>(w),
      d[at + 2] = static_cast<char>(h >> 8), d[at + 3] = static_cast<char>(h);
      WriteFile(Path(name), d);
    };
    patch_size(65535, 65535, "huge.mp4");
    patch_size(16, 16, "lying.mp4");  // says 16x16, the stream is 160x120
    WriteFile(Path("empty.mp4"), "");
    WriteFile(Path("text.mp4"), std::string(500, 'x'));
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static std::string Path(const std::string& name) { return *dir_ / name; }

  // Runs the sampler on one field; outputs land in the members.
  Status Sample(const VideoOptions& o, const FieldValue& f, uint64_t seed = 1, uint32_t epoch = 0,
                VideoSampler* sampler = nullptr) {
    std::unique_ptr<VideoSampler> own;
    if (!sampler) {
      own = std::make_unique<VideoSampler>(o, &cache_);
      sampler = own.get();
    }
    frames_.assign(VideoOutputSpecs("video", o)[0].NumBytes(), 0xAB);
    pts_.assign(o.frames, -1);
    mask_.assign(o.frames, 7);
    Rng rng(seed, epoch, f.data, "video");
    return sampler->Sample(f, &rng, frames_.data(), pts_.data(), mask_.data());
  }

  static VideoOptions Options(VideoSampling s, int frames, int h = 32, int w = 48) {
    VideoOptions o;
    o.sampling = s;
    o.frames = frames;
    o.out_h = h;
    o.out_w = w;
    return o;
  }

  size_t FrameBytes(const VideoOptions& o) const { return frames_.size() / o.frames; }

  static TempDir* dir_;
  KeyframeIndexCache cache_{16};
  std::vector<uint8_t> frames_, mask_;
  std::vector<float> pts_;
};
TempDir* VideoTest::dir_ = nullptr;

TEST_F(VideoTest, StageDeclaresItsTensors) {
  auto stage = MakeStage("video", "video",
                         {{"frames", int64_t{16}}, {"size", std::vector<int64_t>{224, 224}}});
  ASSERT_NE(stage, nullptr);
  auto specs = stage->OutputSpecs();
  ASSERT_EQ(specs.size(), 3u);
  EXPECT_EQ(specs[0].name, "video");
  EXPECT_EQ(specs[0].shape, (std::vector<int64_t>{16, 3, 224, 224}));
  EXPECT_EQ(specs[0].dtype, DType::kUInt8);
  EXPECT_EQ(specs[1].name, "video_pts");
  EXPECT_EQ(specs[1].shape, (std::vector<int64_t>{16}));
  EXPECT_EQ(specs[2].name, "video_mask");
  auto thwc = MakeStage("video", "clip",
                        {{"size", std::vector<int64_t>{8, 10}},
                         {"layout", std::string("THWC")},
                         {"dtype", std::string("float32")}});
  EXPECT_EQ(thwc->OutputSpecs()[0].shape, (std::vector<int64_t>{16, 8, 10, 3}));
  EXPECT_EQ(thwc->OutputSpecs()[0].dtype, DType::kFloat32);
}

TEST_F(VideoTest, RejectsBadParams) {
  auto build = [](std::map<std::string, ParamValue> over) {
    over.emplace("size", std::vector<int64_t>{32, 32});
    return testing::BuildStage("video", "video", over).status();
  };
  EXPECT_TRUE(build({}).ok());
  EXPECT_NE(build({{"sampling", std::string("timestamps")}}).message().find("timestamps"),
            std::string::npos);
  EXPECT_FALSE(build({{"clip_start", std::string("soon")}}).ok());
  EXPECT_FALSE(build({{"frames", int64_t{0}}}).ok());
  EXPECT_FALSE(build({{"fps", 0.0}}).ok());
  EXPECT_FALSE(build({{"size", std::vector<int64_t>{0, 32}}}).ok());
  EXPECT_TRUE(build({{"clip_start", std::string("2.5")}}).ok());
}

TEST_F(VideoTest, UniformFromPathMemoryAndFileRangeAgree) {
  VideoOptions o = Options(VideoSampling::kUniform, 8);
  ASSERT_TRUE(Sample(o, PathField(Path("good.mp4"))).ok());
  const auto frames = frames_;
  const auto pts = pts_;
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(mask_[i], 1);
    EXPECT_NEAR(pts_[i], (i + 0.5) * 4.0 / 8, 0.04 + 1e-4) << i;  // the frame on screen, 25 fps
    if (i) {
      EXPECT_GT(pts_[i], pts_[i - 1]);
    }
  }
  FieldValue mem;
  mem.kind = FieldValue::Kind::kBytes;
  mem.data = ReadFile(Path("good.mp4"));
  ASSERT_TRUE(Sample(o, mem).ok());
  EXPECT_EQ(frames_, frames);
  EXPECT_EQ(pts_, pts);
  // As a tar member: bytes in the middle of a bigger file.
  WriteFile(Path("shard.bin"), std::string(1000, 'h') + mem.data + std::string(777, 't'));
  FieldValue range;
  range.kind = FieldValue::Kind::kFileRange;
  range.data = Path("shard.bin");
  range.offset = 1000;
  range.size = mem.data.size();
  ASSERT_TRUE(Sample(o, range).ok());
  EXPECT_EQ(frames_, frames);
}

TEST_F(VideoTest, ClipStartIsSeededPerSampleAndEpoch) {
  VideoOptions o = Options(VideoSampling::kClip, 6);
  o.fps = 5;
  const FieldValue f = PathField(Path("long.mp4"));
  ASSERT_TRUE(Sample(o, f, 42, 0).ok());
  const auto first = pts_;
  ASSERT_TRUE(Sample(o, f, 42, 0).ok());
  EXPECT_EQ(pts_, first);  // same seed, epoch and id: same clip
  for (int i = 1; i < 6; ++i) EXPECT_NEAR(pts_[i] - pts_[i - 1], 0.2, 0.041) << i;
  int differ = 0;
  for (uint32_t epoch = 1; epoch <= 4; ++epoch) {
    ASSERT_TRUE(Sample(o, f, 42, epoch).ok());
    differ += pts_ != first;
    EXPECT_GE(pts_[0], 0);
    EXPECT_LT(pts_[5], 20.0);
    for (int i = 0; i < 6; ++i) EXPECT_EQ(mask_[i], 1);
  }
  EXPECT_GE(differ, 3);
}

TEST_F(VideoTest, SeeksToTheKeyframeInsteadOfDecodingEverything) {
  VideoOptions o = Options(VideoSampling::kClip, 4);
  o.clip_start = 15.3;
  VideoSampler sampler(o, &cache_);
  ASSERT_TRUE(Sample(o, PathField(Path("long.mp4")), 1, 0, &sampler).ok());
  EXPECT_NEAR(pts_[0], 15.28, 1e-3);
  EXPECT_GE(sampler.stats().seeks, 1);
  // From the keyframe at 15 s to the frame after 16.05 s: ~28 frames, not the 400 before.
  EXPECT_LT(sampler.stats().decoded, 40);
  // Keyframes: one decoded frame per sampled frame.
  VideoOptions k = Options(VideoSampling::kKeyframes, 5);
  VideoSampler ks(k, &cache_);
  ASSERT_TRUE(Sample(k, PathField(Path("long.mp4")), 1, 0, &ks).ok());
  EXPECT_EQ(ks.stats().decoded, 5);
  for (int i = 0; i < 5; ++i)
    EXPECT_NEAR(pts_[i], 2 + 4 * i, 1e-3) << i;  // keyframes 2, 6, 10, 14, 18 of 20
}

TEST_F(VideoTest, DecodesOnlyReferenceFramesAndPicks) {
  // Display order I0 B1 B2 B3 P4 B5 ...; decoding order I0 P4 B2 B1 B3 P8 B6 B5 B7 ...; B2, B6,
  // ... are references. Picking B2, B6, ..., B38 needs I0, the ten P-frames and the ten picks;
  // the non-reference B-frames are skipped, B1 too though B2 went into the decoder before it.
  VideoOptions o = Options(VideoSampling::kTimestamps, 10);
  for (int i = 0; i < 10; ++i) o.timestamps.push_back((4 * i + 2) / 25.0 + 0.001);
  VideoSampler sampler(o, &cache_);
  ASSERT_TRUE(Sample(o, PathField(Path("pyramid.mp4")), 1, 0, &sampler).ok());
  for (int i = 0; i < 10; ++i) EXPECT_NEAR(pts_[i], (4 * i + 2) / 25.0, 1e-4) << i;
  EXPECT_EQ(sampler.stats().decoded, 21);
}

TEST_F(VideoTest, KeyframeIndexIsCachedPerFile) {
  VideoOptions o = Options(VideoSampling::kUniform, 4);
  VideoSampler sampler(o, &cache_);
  ASSERT_TRUE(Sample(o, PathField(Path("good.mp4")), 1, 0, &sampler).ok());
  ASSERT_TRUE(Sample(o, PathField(Path("good.mp4")), 1, 1, &sampler).ok());
  EXPECT_EQ(sampler.stats().index_misses, 1);
  EXPECT_EQ(sampler.stats().index_hits, 1);

  KeyframeIndexCache small(2);
  auto idx = std::make_shared<KeyframeIndex>();
  small.Put("a", idx);
  small.Put("b", idx);
  EXPECT_NE(small.Find("a"), nullptr);  // a is now the most recent
  small.Put("c", idx);                  // evicts b
  EXPECT_EQ(small.Find("b"), nullptr);
  EXPECT_NE(small.Find("a"), nullptr);
  EXPECT_NE(small.Find("c"), nullptr);
  EXPECT_EQ(small.size(), 2u);
}

TEST_F(VideoTest, PadsPastTheEndAndMasks) {
  VideoOptions o = Options(VideoSampling::kClip, 8);
  o.fps = 2;
  o.clip_start = 2.6;  // 2.6 .. 6.1 s of a 4 s video: 3 frames, 5 padded
  ASSERT_TRUE(Sample(o, PathField(Path("good.mp4"))).ok());
  EXPECT_EQ(mask_, (std::vector<uint8_t>{1, 1, 1, 0, 0, 0, 0, 0}));
  const size_t fb = FrameBytes(o);
  for (int i = 3; i < 8; ++i) {
    EXPECT_EQ(pts_[i], pts_[2]);
    EXPECT_EQ(0, std::memcmp(&frames_[i * fb], &frames_[2 * fb], fb)) << i;
  }
  o.pad = VideoPad::kZeros;
  ASSERT_TRUE(Sample(o, PathField(Path("good.mp4"))).ok());
  for (int i = 3; i < 8; ++i) {
    EXPECT_EQ(pts_[i], 0);
    for (size_t b = 0; b < fb; ++b) ASSERT_EQ(frames_[i * fb + b], 0) << i;
  }
  o.clip_start = 5;
  Status past = Sample(o, PathField(Path("good.mp4")));
  EXPECT_NE(past.message().find("past the end"), std::string::npos) << past.message();
}

TEST_F(VideoTest, Float32IsNormalizedUint8) {
  VideoOptions u = Options(VideoSampling::kUniform, 2);
  ASSERT_TRUE(Sample(u, PathField(Path("good.mp4"))).ok());
  const auto bytes = frames_;
  VideoOptions f = u;
  f.pixels.dtype = DType::kFloat32;
  const float mean[3] = {0.5f, 0.4f, 0.3f}, stdv[3] = {0.2f, 0.25f, 0.3f};
  for (int c = 0; c < 3; ++c) {
    f.pixels.mul[c] = 1.0f / (255.0f * stdv[c]);
    f.pixels.add[c] = -mean[c] / stdv[c];
  }
  ASSERT_TRUE(Sample(f, PathField(Path("good.mp4"))).ok());
  const float* out = reinterpret_cast<const float*>(frames_.data());
  for (size_t i = 0; i < bytes.size(); i += 97) {
    const size_t plane = 32 * 48, c = (i % (3 * plane)) / plane;
    EXPECT_NEAR(out[i], (bytes[i] / 255.0f - mean[c]) / stdv[c], 1e-4) << i;
  }
}

// bfloat16 is the float32 output rounded, in every layout.
TEST_F(VideoTest, BFloat16IsTheFloat32OutputRounded) {
  for (VideoLayout layout : {VideoLayout::kTCHW, VideoLayout::kTHWC, VideoLayout::kCTHW}) {
    VideoOptions f = Options(VideoSampling::kUniform, 3);
    f.layout = layout;
    f.pixels.dtype = DType::kFloat32;
    for (int c = 0; c < 3; ++c) {
      f.pixels.mul[c] = 1.0f / (255.0f * 0.5f);
      f.pixels.add[c] = -1.0f;
    }
    ASSERT_TRUE(Sample(f, PathField(Path("good.mp4"))).ok());
    const std::vector<uint8_t> f32 = frames_;
    VideoOptions b = f;
    b.pixels.dtype = DType::kBFloat16;
    EXPECT_EQ(VideoOutputSpecs("video", b)[0].dtype, DType::kBFloat16);
    ASSERT_TRUE(Sample(b, PathField(Path("good.mp4"))).ok());
    ASSERT_EQ(frames_.size() * 2, f32.size());
    const float* x = reinterpret_cast<const float*>(f32.data());
    const uint16_t* y = reinterpret_cast<const uint16_t*>(frames_.data());
    for (size_t i = 0; i < frames_.size() / 2; ++i)
      ASSERT_EQ(y[i], ToBFloat16(x[i])) << static_cast<int>(layout) << " " << i;
  }
}

struct BadCase {
  const char* file;
  Status::Code code;
  const char* says;
};

TEST_F(VideoTest, BadInputsAreClearPerSampleErrors) {
  const BadCase cases[] = {
      {"audio.m4a", Status::Code::kCorrupt, "no video stream"},
      {"no_moov.mp4", Status::Code::kCorrupt, "not a readable video file"},
      {"cut.mp4", Status::Code::kCorrupt, "truncated"},
      {"corrupt.mp4", Status::Code::kCorrupt, "damaged"},
      {"huge.mp4", Status::Code::kTooLarge, "65535x65535 is over max_pixels"},
      {"empty.mp4", Status::Code::kCorrupt, "empty file"},
      {"no_frames.mp4", Status::Code::kCorrupt, "no decodable frames"},
      {"text.mp4", Status::Code::kCorrupt, "not a readable video file"},
      {"missing.mp4", Status::Code::kNotFound, "no such file"},
  };
  VideoOptions o = Options(VideoSampling::kUniform, 8);
  VideoSampler sampler(o, &cache_);  // one sampler across failures, as a worker keeps it
  for (const BadCase& c : cases) {
    Status s = Sample(o, PathField(Path(c.file)), 1, 0, &sampler);
    EXPECT_EQ(s.code(), c.code) << c.file << ": " << s.message();
    EXPECT_NE(s.message().find(c.says), std::string::npos) << c.file << ": " << s.message();
  }
  // Found by fuzz_video: a seek to a keyframe past the end, then nothing decodes (it hung).
  Status hang = Sample(o, PathField(testing::TestData("video/fuzz_seek_hang.mkv")), 1, 0, &sampler);
  EXPECT_EQ(hang.code(), Status::Code::kCorrupt) << hang.message();
  // The decoder's own limit catches a stream larger than its container says.
  VideoOptions tight = o;
  tight.max_pixels = 64 * 64;
  EXPECT_FALSE(Sample(tight, PathField(Path("lying.mp4"))).ok());
  // Keyframe sampling meets the same damage.
  VideoOptions k = Options(VideoSampling::kKeyframes, 4);
  EXPECT_FALSE(Sample(k, PathField(Path("corrupt.mp4"))).ok());
  // And the sampler still works afterwards.
  EXPECT_TRUE(Sample(o, PathField(Path("good.mp4")), 1, 0, &sampler).ok());
}

}  // namespace
}  // namespace mmfeed
