// The --state-dir store (daemon/state_store.h): written atomically through the folder opened
// once, an unchanged state not written again, a deleted folder made again, a folder that is a
// symlink refused and one swapped for a symlink later written through nothing.
#include "daemon/state_store.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>

#include "tests/test_util.h"

namespace mmfeed {
namespace {

using testing::TempDir;

StreamState AState(uint64_t seq) {
  StreamState s;
  s.pipeline = "p";
  s.fingerprint = "00000000000000aa";
  s.ranks = {StreamCursor{0, seq, seq}};
  return s;
}

TEST(StateStoreTest, WritesWhatChangedAndReadsItBack) {
  TempDir dir;
  StateStore store(dir / "state");
  Result<std::optional<StreamState>> none = store.Read();
  ASSERT_TRUE(none.ok()) << none.status().message();
  EXPECT_FALSE(none->has_value()) << "nothing saved yet";
  ASSERT_TRUE(store.Write(AState(3)).ok());
  struct stat first {};
  ASSERT_EQ(::stat(store.path().c_str(), &first), 0);
  ASSERT_TRUE(store.Write(AState(3)).ok());
  struct stat same {};
  ASSERT_EQ(::stat(store.path().c_str(), &same), 0);
  EXPECT_EQ(first.st_ino, same.st_ino) << "an unchanged state is not written again";
  ASSERT_TRUE(store.Write(AState(4)).ok());
  struct stat next {};
  ASSERT_EQ(::stat(store.path().c_str(), &next), 0);
  EXPECT_NE(first.st_ino, next.st_ino) << "replaced by rename, never rewritten in place";
  Result<std::optional<StreamState>> back = StateStore(dir / "state").Read();
  ASSERT_TRUE(back.ok() && back->has_value());
  EXPECT_EQ((*back)->ranks.at(0).seq, 4u);
  store.Forget();
  ASSERT_TRUE(store.Write(AState(4)).ok());
  struct stat again {};
  ASSERT_EQ(::stat(store.path().c_str(), &again), 0);
  EXPECT_NE(next.st_ino, again.st_ino) << "after Forget, written even unchanged";
}

TEST(StateStoreTest, ADeletedFolderIsMadeAgainWhereItWas) {
  TempDir dir;
  StateStore store(dir / "state");
  ASSERT_TRUE(store.Read().ok());
  ASSERT_TRUE(store.Write(AState(1)).ok());
  std::filesystem::remove_all(dir / "state");
  ASSERT_TRUE(store.Write(AState(2)).ok());
  EXPECT_TRUE(std::filesystem::is_regular_file(dir / "state/cursors.json"));
  EXPECT_EQ(store.failures(), 0u);
}

TEST(StateStoreTest, AFolderSwappedForASymlinkRedirectsNothing) {
  TempDir dir;
  std::filesystem::create_directories(dir / "elsewhere");
  std::filesystem::create_directory_symlink(dir / "elsewhere", dir / "link");
  StateStore refused(dir / "link");
  EXPECT_FALSE(refused.Read().ok()) << "a symlink as the folder is refused";
  StateStore store(dir / "state");
  ASSERT_TRUE(store.Read().ok());
  std::filesystem::rename(dir / "state", dir / "moved");
  std::filesystem::create_directory_symlink(dir / "elsewhere", dir / "state");
  ASSERT_TRUE(store.Write(AState(5)).ok());
  EXPECT_FALSE(std::filesystem::exists(dir / "elsewhere/cursors.json"))
      << "written through the symlink";
  EXPECT_TRUE(std::filesystem::exists(dir / "moved/cursors.json"))
      << "the folder opened once, wherever it was moved";
}

TEST(StateStoreTest, WithoutAFolderNothingIsKept) {
  StateStore store("");
  EXPECT_FALSE(store.enabled());
  Result<std::optional<StreamState>> r = store.Read();
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->has_value());
  EXPECT_TRUE(store.Write(AState(1)).ok());
}

}  // namespace
}  // namespace mmfeed
