#include "source/brace.h"

#include <fmt/format.h>

namespace mmfeed {

Result<std::vector<std::string>> ExpandBraces(const std::string& pattern) {
  size_t open = pattern.find('{');
  if (open == std::string::npos) {
    if (pattern.find('}') != std::string::npos)
      return Status::Invalid(fmt::format("'{}': '}}' without '{{'", pattern));
    return std::vector<std::string>{pattern};
  }
  size_t close = pattern.find('}', open);
  if (close == std::string::npos)
    return Status::Invalid(fmt::format("'{}': '{{' without '}}'", pattern));
  std::string head = pattern.substr(0, open);
  std::string body = pattern.substr(open + 1, close - open - 1);
  Result<std::vector<std::string>> tails = ExpandBraces(pattern.substr(close + 1));
  if (!tails.ok()) return tails;
  std::vector<std::string> alternatives;
  size_t dots = body.find("..");
  if (dots != std::string::npos) {
    std::string a = body.substr(0, dots), b = body.substr(dots + 2);
    auto digits = [](const std::string& s) {
      return !s.empty() && s.size() <= 9 && s.find_first_not_of("0123456789") == std::string::npos;
    };
    if (!digits(a) || !digits(b))
      return Status::Invalid(
          fmt::format("'{}': range '{{{}}}' must be two numbers like {{000..099}}", pattern, body));
    long lo = std::stol(a), hi = std::stol(b);
    if (hi < lo)
      return Status::Invalid(fmt::format("'{}': range '{{{}}}' runs backwards", pattern, body));
    if (hi - lo > 10000000)
      return Status::Invalid(fmt::format("'{}': range '{{{}}}' is too large", pattern, body));
    size_t width = a.size();
    for (long i = lo; i <= hi; ++i) alternatives.push_back(fmt::format("{:0{}}", i, width));
  } else {
    size_t start = 0;
    while (true) {
      size_t comma = body.find(',', start);
      alternatives.push_back(body.substr(start, comma - start));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
  }
  std::vector<std::string> out;
  for (const std::string& alt : alternatives)
    for (const std::string& tail : *tails) out.push_back(head + alt + tail);
  return out;
}

}  // namespace mmfeed
