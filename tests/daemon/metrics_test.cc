// PromText (daemon/metrics.h): the Prometheus text format, escaped as the format says.
#include "daemon/metrics.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace mmfeed {
namespace {

TEST(PromTextTest, FamiliesSamplesAndEscapes) {
  PromText t;
  t.Family("mmfeed_x_total", "counter", "Items: a \\ and\na line break.");
  t.Sample("mmfeed_x_total", {{"stage", "im\"a\\ge\n"}, {"a", "b"}}, 3);
  t.Sample("mmfeed_y", 0.25);
  t.Sample("mmfeed_y", 1e20);
  t.Sample("mmfeed_y", std::numeric_limits<double>::quiet_NaN());
  t.Sample("mmfeed_y", -std::numeric_limits<double>::infinity());
  EXPECT_EQ(t.text(),
            "# HELP mmfeed_x_total Items: a \\\\ and\\na line break.\n"
            "# TYPE mmfeed_x_total counter\n"
            "mmfeed_x_total{a=\"b\",stage=\"im\\\"a\\\\ge\\n\"} 3\n"
            "mmfeed_y 0.25\n"
            "mmfeed_y 1e+20\n"
            "mmfeed_y NaN\n"
            "mmfeed_y -Inf\n");
}

}  // namespace
}  // namespace mmfeed
