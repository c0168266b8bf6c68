// What `mmfeedd --check` finds of the files a catalog's samples name, before any is decoded:
// whether each exists, lies inside the data roots (by real path, as FieldFile::Open checks it)
// and is readable by this process. Every sample when the catalog is small, else an even spread
// of `max_samples` of them. Remote shards' members and tar members are not looked at (their
// shards were opened when the catalog was indexed).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "source/catalog.h"
#include "source/sample.h"

namespace mmfeed {

struct PathCheck {
  size_t samples = 0;       // samples whose files were looked at
  size_t catalog_size = 0;  // samples in the catalog
  size_t files = 0;         // local files they name
  struct Problem {
    size_t count = 0;
    std::string example;  // one file, as the manifest names it, and what is wrong with it
  };
  Problem outside, missing, unreadable;
  std::vector<std::string> roots;  // the data roots in force (FilePolicy::roots; empty: any)
  // The real folders of the files outside the roots: the data_roots that would admit them
  // (their common folder, or each's top two levels when they share none but /).
  std::vector<std::string> suggested_roots;
};

PathCheck CheckCatalogPaths(const Catalog& catalog, const FilePolicy& policy, size_t max_samples);

}  // namespace mmfeed
