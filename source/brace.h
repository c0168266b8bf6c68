// Brace expansion for shard patterns, as WebDataset writes them:
// "shard-{00000..00099}.tar" (numeric ranges keep their zero padding) and "{train,val}.tar".
#pragma once

#include <string>
#include <vector>

#include "base/status.h"

namespace mmfeed {

Result<std::vector<std::string>> ExpandBraces(const std::string& pattern);

}  // namespace mmfeed
