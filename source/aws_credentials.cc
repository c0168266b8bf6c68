#include "source/aws_credentials.h"

#include <fmt/format.h>

#include <fstream>

namespace mmfeed {
namespace {

std::string_view TrimSpace(std::string_view s) {
  const size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(" \t\r") - b + 1);
}

}  // namespace

Result<AwsCredentials> ParseAwsCredentials(std::string_view text, const std::string& profile,
                                           const std::string& path) {
  AwsCredentials c;
  std::string_view section;
  while (!text.empty()) {
    const size_t end = text.find('\n');
    std::string_view line = TrimSpace(text.substr(0, end));
    text = end == std::string_view::npos ? std::string_view() : text.substr(end + 1);
    if (line.empty() || line[0] == '#' || line[0] == ';') continue;
    if (line.front() == '[' && line.back() == ']') {
      section = TrimSpace(line.substr(1, line.size() - 2));
      continue;
    }
    const size_t eq = line.find('=');
    if (section != profile || eq == std::string_view::npos) continue;
    const std::string_view k = TrimSpace(line.substr(0, eq)), v = TrimSpace(line.substr(eq + 1));
    if (k == "aws_access_key_id") c.key = v;
    if (k == "aws_secret_access_key") c.secret = v;
    if (k == "aws_session_token") c.token = v;
  }
  if (c.key.empty() || c.secret.empty())
    return Status::Invalid(fmt::format(
        "{}: profile [{}] has no aws_access_key_id and aws_secret_access_key", path, profile));
  return c;
}

Result<AwsCredentials> ReadAwsCredentials(const std::string& path, const std::string& profile) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::NotFound(fmt::format("{}: cannot open the credentials file", path));
  std::string text(kMaxCredentialsBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() > kMaxCredentialsBytes)
    return Status::Invalid(fmt::format("{}: larger than {} bytes: not a credentials file", path,
                                       kMaxCredentialsBytes));
  return ParseAwsCredentials(text, profile, path);
}

}  // namespace mmfeed
