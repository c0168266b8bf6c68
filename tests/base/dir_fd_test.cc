#include "base/dir_fd.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

#include "tests/test_util.h"

namespace mmfeed {
namespace {

using testing::TempDir;

bool Empty(const std::string& dir) { return std::filesystem::is_empty(dir); }

// Writes `name` holding `text` as a cache would: unnamed, then linked.
bool Put(const DirFd& d, const std::string& name, const std::string& text) {
  const int fd = d.OpenUnnamed(0600);
  if (fd < 0 || ::write(fd, text.data(), text.size()) != static_cast<ssize_t>(text.size()))
    return false;
  const bool ok = d.Link(fd, name);
  ::close(fd);
  return ok;
}

TEST(DirFdTest, ASymlinkOrAFileIsRefusedAtOpenNamingIt) {
  TempDir tmp;
  std::filesystem::create_directory(tmp / "victim");
  std::filesystem::create_directory_symlink(tmp / "victim", tmp / "link");
  Result<DirFd> d = DirFd::Open(tmp / "link", "source.cache.dir", /*create=*/true);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("source.cache.dir"), std::string::npos);
  EXPECT_NE(d.status().message().find(tmp / "link" + " is a symbolic link: refused"),
            std::string::npos)
      << d.status().message();
  testing::WriteFile(tmp / "file", "x");
  d = DirFd::Open(tmp / "file", "--state-dir", /*create=*/true);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("is not a folder"), std::string::npos);
  EXPECT_TRUE(Empty(tmp / "victim"));
}

TEST(DirFdTest, AFolderOfAnotherUserIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give a folder to another user";
  TempDir tmp;
  std::filesystem::create_directory(tmp / "theirs");
  ASSERT_EQ(::chown((tmp / "theirs").c_str(), 65534, 65534), 0);
  Result<DirFd> d = DirFd::Open(tmp / "theirs", "cache.disk.dir", /*create=*/false);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("belongs to user"), std::string::npos)
      << d.status().message();
  EXPECT_NE(d.status().message().find("not to the daemon's user"), std::string::npos);
}

// The folder swapped for a symlink after the open (renamed away, a link in its place): writes
// still go to the folder that was opened, never to the link's target.
TEST(DirFdTest, AFolderSwappedForASymlinkRedirectsNothing) {
  TempDir tmp;
  std::filesystem::create_directory(tmp / "victim");
  Result<DirFd> d = DirFd::Open(tmp / "cache", "source.cache.dir", /*create=*/true);
  ASSERT_TRUE(d.ok()) << d.status().message();
  Result<DirFd> sub = d->Sub("tier", /*create=*/true, 0700);
  ASSERT_TRUE(sub.ok()) << sub.status().message();
  std::filesystem::rename(tmp / "cache", tmp / "moved");
  std::filesystem::create_directory_symlink(tmp / "victim", tmp / "cache");
  EXPECT_TRUE(Put(*d, "a", "1"));
  EXPECT_TRUE(Put(*sub, "b", "2"));
  ASSERT_TRUE(d->WriteAtomically("cursors.json", "{}").ok());
  EXPECT_TRUE(Empty(tmp / "victim"));
  EXPECT_EQ(testing::ReadFile(tmp / "moved/a"), "1");
  EXPECT_EQ(testing::ReadFile(tmp / "moved/tier/b"), "2");
  EXPECT_EQ(testing::ReadFile(tmp / "moved/cursors.json"), "{}");
  EXPECT_EQ(d->List().size(), 3u);
  EXPECT_TRUE(d->RemoveTree("tier"));
  EXPECT_FALSE(std::filesystem::exists(tmp / "moved/tier"));
}

// Deleted, then a symlink planted under its name: made again refuses it; deleted alone: made
// again where it was.
TEST(DirFdTest, ADeletedFolderIsMadeAgainButNeverThroughASymlink) {
  TempDir tmp;
  std::filesystem::create_directory(tmp / "victim");
  Result<DirFd> d = DirFd::Open(tmp / "cache", "source.cache.dir", /*create=*/true);
  ASSERT_TRUE(d.ok());
  EXPECT_FALSE(d->Gone());
  std::filesystem::remove_all(tmp / "cache");
  EXPECT_TRUE(d->Gone());
  EXPECT_LT(d->OpenUnnamed(0600), 0);
  ASSERT_TRUE(d->Refresh(/*create=*/true).ok());
  EXPECT_TRUE(Put(*d, "a", "1"));
  EXPECT_EQ(testing::ReadFile(tmp / "cache/a"), "1");
  std::filesystem::remove_all(tmp / "cache");
  std::filesystem::create_directory_symlink(tmp / "victim", tmp / "cache");
  Status st = d->Refresh(/*create=*/true);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("is a symbolic link: refused"), std::string::npos);
  Result<DirFd> again = d->Reopen(/*create=*/true);
  EXPECT_FALSE(again.ok());
  EXPECT_TRUE(Empty(tmp / "victim"));
}

TEST(DirFdTest, RemoveTreeNeverFollowsASymlinkInside) {
  TempDir tmp;
  testing::WriteFile(tmp / "victim/keep", "k");
  Result<DirFd> d = DirFd::Open(tmp / "cache", "dir", /*create=*/true);
  ASSERT_TRUE(d.ok());
  Result<DirFd> sub = d->Sub("tier", /*create=*/true);
  ASSERT_TRUE(sub.ok());
  std::filesystem::create_directory_symlink(tmp / "victim", tmp / "cache/tier/link");
  EXPECT_TRUE(d->RemoveTree("tier"));
  EXPECT_EQ(testing::ReadFile(tmp / "victim/keep"), "k");
  EXPECT_FALSE(d->Sub("../x", true).ok());
}

}  // namespace
}  // namespace mmfeed
