// The AWS shared credentials file (~/.aws/credentials, $AWS_SHARED_CREDENTIALS_FILE, or
// source.s3.credentials_file): an INI file of "[profile]" sections and "key = value" lines, of
// which a profile's aws_access_key_id, aws_secret_access_key and aws_session_token are read.
//
// A bounded parser: at most kMaxCredentialsBytes are read (a larger file is refused, not
// parsed); lines starting with '#' or ';' are comments; a key given twice in a profile keeps its
// last value; a section may be given twice (its keys merge); everything else is ignored, as the
// AWS tools ignore it. Nothing is logged: the values are secrets.
#pragma once

#include <string>
#include <string_view>

#include "base/status.h"

namespace mmfeed {

struct AwsCredentials {
  std::string key, secret, token;  // token: empty without a session
};

inline constexpr size_t kMaxCredentialsBytes = 1 << 20;

// `profile`'s credentials in `text` (read from `path`, which errors name); an error when the
// profile lacks a key or a secret.
Result<AwsCredentials> ParseAwsCredentials(std::string_view text, const std::string& profile,
                                           const std::string& path);
// The same from the file at `path`.
Result<AwsCredentials> ReadAwsCredentials(const std::string& path, const std::string& profile);

}  // namespace mmfeed
