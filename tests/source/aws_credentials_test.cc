// The S3 credentials file's reader (source/aws_credentials.h).
#include "source/aws_credentials.h"

#include <gtest/gtest.h>

#include "tests/test_util.h"

namespace mmfeed {
namespace {

constexpr char kFile[] =
    "# a comment\n"
    "[default]\n"
    "aws_access_key_id = AKIDEFAULT\n"
    "aws_secret_access_key=secret-default\n"
    "\n"
    "  [ job ]  \r\n"
    "; another comment\n"
    "aws_access_key_id =AKIJOB\t\n"
    "aws_secret_access_key = s=with=equals \n"
    "aws_session_token = tok\n"
    "region = eu-west-1\n"
    "[default]\n"
    "aws_access_key_id = AKILATER\n";

TEST(AwsCredentialsTest, ReadsTheProfilesKeys) {
  Result<AwsCredentials> d = ParseAwsCredentials(kFile, "default", "/c");
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_EQ(d->key, "AKILATER") << "a section given twice merges; the last value wins";
  EXPECT_EQ(d->secret, "secret-default");
  EXPECT_EQ(d->token, "");
  Result<AwsCredentials> j = ParseAwsCredentials(kFile, "job", "/c");
  ASSERT_TRUE(j.ok()) << j.status().message();
  EXPECT_EQ(j->key, "AKIJOB");
  EXPECT_EQ(j->secret, "s=with=equals") << "a value may hold '='";
  EXPECT_EQ(j->token, "tok");
}

TEST(AwsCredentialsTest, AMissingProfileOrKeyIsAnErrorThatShowsNoSecret) {
  for (const char* profile : {"none", "Default"}) {
    Result<AwsCredentials> r = ParseAwsCredentials(kFile, profile, "/home/u/.aws/credentials");
    ASSERT_FALSE(r.ok()) << profile;
    EXPECT_EQ(r.status().message(), std::string("/home/u/.aws/credentials: profile [") + profile +
                                        "] has no aws_access_key_id and aws_secret_access_key");
  }
  EXPECT_FALSE(ParseAwsCredentials("[x]\naws_access_key_id = A\n", "x", "/c").ok());
  EXPECT_FALSE(ParseAwsCredentials("", "default", "/c").ok());
  EXPECT_FALSE(
      ParseAwsCredentials("aws_access_key_id = A\naws_secret_access_key = B\n", "default", "/c")
          .ok())
      << "keys before any section belong to no profile";
}

TEST(AwsCredentialsTest, TheFileIsBounded) {
  testing::TempDir dir;
  testing::WriteFile(dir / "c", kFile);
  Result<AwsCredentials> r = ReadAwsCredentials(dir / "c", "job");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->key, "AKIJOB");
  testing::WriteFile(dir / "big", std::string(kMaxCredentialsBytes + 1, '#'));
  Result<AwsCredentials> big = ReadAwsCredentials(dir / "big", "job");
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.status().message().find("not a credentials file"), std::string::npos);
  Result<AwsCredentials> none = ReadAwsCredentials(dir / "none", "job");
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("cannot open the credentials file"), std::string::npos);
}

}  // namespace
}  // namespace mmfeed
