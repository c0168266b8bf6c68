// WriteFileAtomically and ReadSmallFile (base/atomic_file.h).
#include "base/atomic_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

#include "tests/test_util.h"

namespace mmfeed {
namespace {

std::vector<std::string> Names(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) out.push_back(e.path().filename());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(AtomicFileTest, ReplacesWholeAndLeavesNoTemporaryFile) {
  testing::TempDir dir;
  ASSERT_TRUE(WriteFileAtomically(dir / "f", "one").ok());
  ASSERT_TRUE(WriteFileAtomically(dir / "f", "two, longer").ok());
  Result<std::optional<std::string>> r = ReadSmallFile(dir / "f", 100);
  ASSERT_TRUE(r.ok() && r->has_value());
  EXPECT_EQ(**r, "two, longer");
  EXPECT_EQ(Names(dir.path()), std::vector<std::string>{"f"});
}

TEST(AtomicFileTest, AFailedWriteLeavesTheOldContent) {
  testing::TempDir dir;
  ASSERT_TRUE(WriteFileAtomically(dir / "f", "old").ok());
  // A folder where the file is: the rename fails; the temporary file is removed.
  std::filesystem::create_directory(dir / "d");
  EXPECT_FALSE(WriteFileAtomically(dir / "d", "new").ok());
  EXPECT_EQ(Names(dir.path()), (std::vector<std::string>{"d", "f"}));
  // A folder that does not exist: an error naming the path.
  Status st = WriteFileAtomically(dir / "none/f", "x");
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find(dir / "none/f"), std::string::npos) << st.message();
  EXPECT_EQ(**ReadSmallFile(dir / "f", 100), "old");
}

TEST(AtomicFileTest, ASymlinkIsReplacedNotFollowed) {
  testing::TempDir dir;
  testing::WriteFile(dir / "target", "precious");
  ASSERT_EQ(symlink((dir / "target").c_str(), (dir / "f").c_str()), 0);
  ASSERT_TRUE(WriteFileAtomically(dir / "f", "new").ok());
  EXPECT_EQ(**ReadSmallFile(dir / "target", 100), "precious");
  struct stat st;
  ASSERT_EQ(lstat((dir / "f").c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
}

TEST(AtomicFileTest, ReadSmallFileRefusesWhatIsNotASmallRegularFile) {
  testing::TempDir dir;
  EXPECT_FALSE(ReadSmallFile(dir / "none", 10)->has_value());
  testing::WriteFile(dir / "big", std::string(11, 'x'));
  EXPECT_FALSE(ReadSmallFile(dir / "big", 10).ok());
  EXPECT_FALSE(ReadSmallFile(dir.path(), 10).ok());
  ASSERT_EQ(mkfifo((dir / "fifo").c_str(), 0600), 0);
  EXPECT_FALSE(ReadSmallFile(dir / "fifo", 10).ok());
  ASSERT_EQ(symlink((dir / "big").c_str(), (dir / "link").c_str()), 0);
  Result<std::optional<std::string>> l = ReadSmallFile(dir / "link", 100);
  ASSERT_FALSE(l.ok());
  EXPECT_NE(l.status().message().find(dir / "link"), std::string::npos) << l.status().message();
}

}  // namespace
}  // namespace mmfeed
