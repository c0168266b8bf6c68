// The seeded Feistel permutation (source/permutation.h).
#include "source/permutation.h"

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

// Every index exactly once, for sizes that are primes, powers of two (even and odd exponents),
// one more or less than one, and tiny.
TEST(PermutationTest, IsABijectionForManySizes) {
  for (uint64_t n : {1ull,    2ull,    3ull,     4ull,     5ull,      7ull,      8ull,    16ull,
                     31ull,   32ull,   33ull,    97ull,    127ull,    128ull,    1000ull, 1023ull,
                     1024ull, 1025ull, 65521ull, 65536ull, 131072ull, 1000003ull}) {
    for (uint64_t seed : {0ull, 42ull}) {
      Permutation p(n, seed);
      std::vector<bool> seen(n);
      for (uint64_t i = 0; i < n; ++i) {
        const uint64_t v = p(i);
        ASSERT_LT(v, n) << "n " << n;
        ASSERT_FALSE(seen[v]) << "n " << n << ": " << v << " twice";
        seen[v] = true;
      }
    }
  }
}

// The inverse undoes the permutation for every position (sizes with and without cycle walking),
// so that a cache finds a sample's next position in O(1).
TEST(PermutationTest, InverseUndoesIt) {
  for (uint64_t n : {1ull, 2ull, 3ull, 5ull, 16ull, 33ull, 1000ull, 1025ull, 65536ull, 100003ull})
    for (uint64_t seed : {0ull, 9ull}) {
      Permutation p(n, seed);
      for (uint64_t i = 0; i < n; ++i) ASSERT_EQ(p.Inverse(p(i)), i) << "n " << n;
    }
  Permutation big(1000000000, 1);
  EXPECT_EQ(big.Inverse(big(123456789)), 123456789u);
}

// Positions are computed one at a time and equal whichever order they are asked in (a cursor
// resumes with no replay); different seeds give different orders.
TEST(PermutationTest, IsDeterministicPerPositionAndSeeded) {
  Permutation a(1000003, 7), b(1000003, 7), c(1000003, 8);
  EXPECT_EQ(a(999999), b(999999));
  EXPECT_EQ(a(0), b(0));
  int same = 0;
  for (uint64_t i = 0; i < 1000; ++i) same += a(i) == c(i);
  EXPECT_LT(same, 5);
  // A billion samples: positions at the far end cost what the first ones do.
  Permutation big(1000000000, 1);
  EXPECT_LT(big(999999999), 1000000000u);
}

// The statistics a training order needs: consecutive positions land far apart and
// uncorrelated, and where a position goes does not depend on where it starts (no index stays
// near its place more often than chance).
TEST(PermutationTest, LooksShuffled) {
  const uint64_t n = 100000;
  Permutation p(n, 3);
  double sum_xy = 0, sum_x = 0, sum_y = 0, sum_xx = 0, sum_yy = 0;
  int near = 0;
  for (uint64_t i = 0; i + 1 < n; ++i) {
    const double x = static_cast<double>(p(i)), y = static_cast<double>(p(i + 1));
    sum_x += x;
    sum_y += y;
    sum_xy += x * y;
    sum_xx += x * x;
    sum_yy += y * y;
    near += std::llabs(static_cast<int64_t>(p(i)) - static_cast<int64_t>(i)) < 100;
  }
  const double m = n - 1;
  const double r = (sum_xy - sum_x * sum_y / m) /
                   std::sqrt((sum_xx - sum_x * sum_x / m) * (sum_yy - sum_y * sum_y / m));
  EXPECT_LT(std::abs(r), 0.02) << "successive positions correlate";
  // P(|p(i) - i| < 100) is about 2 * 100 / n = 0.2%: 200 expected.
  EXPECT_LT(near, 400);
  EXPECT_GT(near, 80);
}

}  // namespace
}  // namespace mmfeed
