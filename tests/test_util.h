// Helpers shared by the tests: a temporary directory that removes itself, file writing, and
// a small image-text dataset built from the photos in tests/data/photos.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <string>
#include <vector>

namespace mmfeed::testing {

// Bytes written out one by one (a hand-encoded fixture): Bytes({0x15, 0x05, 'a'}).
inline std::string Bytes(std::initializer_list<int> b) {
  std::string s;
  for (int x : b) s.push_back(static_cast<char>(x));
  return s;
}

inline std::string TestData(const std::string& rel) {
  return std::string(MMFEED_TEST_DATA) + "/" + rel;
}

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/mmfeed-test-XXXXXX";
    path_ = mkdtemp(tmpl);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& rel) const { return path_ + "/" + rel; }

 private:
  std::string path_;
};

inline void WriteFile(const std::string& path, const std::string& data) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << data;
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

inline std::vector<std::string> PhotoNames() {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(TestData("photos")))
    if (e.path().extension() == ".jpg") out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// Writes `count` samples (photos cycled, captions "caption <i>") and manifest.jsonl into dir.
inline void MakeImageTextDataset(const std::string& dir, int count) {
  std::vector<std::string> photos = PhotoNames();
  for (const std::string& p : photos)
    std::filesystem::copy_file(TestData("photos/" + p), dir + "/" + p,
                               std::filesystem::copy_options::overwrite_existing);
  std::ofstream m(dir + "/manifest.jsonl");
  for (int i = 0; i < count; ++i)
    m << "{\"id\": \"s" << i << "\", \"image\": \"" << photos[i % photos.size()]
      << "\", \"text\": \"caption " << i << "\"}\n";
}

}  // namespace mmfeed::testing

namespace mmfeed::testing {

// Rewrites the frame size in a JPEG's SOF marker, making a file that declares w x h pixels.
inline std::string PatchJpegSize(std::string jpeg, int w, int h) {
  for (size_t i = 2; i + 9 < jpeg.size(); ++i) {
    unsigned char m = static_cast<unsigned char>(jpeg[i + 1]);
    if (static_cast<unsigned char>(jpeg[i]) == 0xFF && (m == 0xC0 || m == 0xC1 || m == 0xC2)) {
      jpeg[i + 5] = static_cast<char>(h >> 8);
      jpeg[i + 6] = static_cast<char>(h & 0xFF);
      jpeg[i + 7] = static_cast<char>(w >> 8);
      jpeg[i + 8] = static_cast<char>(w & 0xFF);
      return jpeg;
    }
  }
  ADD_FAILURE() << "no SOF marker";
  return jpeg;
}

}  // namespace mmfeed::testing
