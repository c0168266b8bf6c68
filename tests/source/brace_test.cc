// Brace expansion of shard paths (source/brace.h).
#include "source/brace.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "tests/test_util.h"

namespace mmfeed {
namespace {

using testing::TempDir;
using testing::WriteFile;

TEST(BraceTest, ExpandsRangesWithPaddingAndLists) {
  auto r = ExpandBraces("data/shard-{00000..00003}.tar");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, (std::vector<std::string>{"data/shard-00000.tar", "data/shard-00001.tar",
                                          "data/shard-00002.tar", "data/shard-00003.tar"}));
  r = ExpandBraces("{train,val}-{0..1}.tar");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, (std::vector<std::string>{"train-0.tar", "train-1.tar", "val-0.tar", "val-1.tar"}));
  EXPECT_FALSE(ExpandBraces("shard-{5..1}.tar").ok());
  EXPECT_FALSE(ExpandBraces("shard-{1..x}.tar").ok());
  EXPECT_FALSE(ExpandBraces("shard-{1..2.tar").ok());
}

// A minimal ustar writer for the tests.

}  // namespace
}  // namespace mmfeed
