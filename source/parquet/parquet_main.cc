// mmfeed-parquet: a Parquet file's metadata as mmfeed reads it (the schema's leaf columns with
// their types and levels, the row groups' column chunks: codec, encodings, offsets, sizes), one
// JSON object per file, or the error that makes mmfeed refuse the file.
#include <cstdio>
#include <cstring>
#include <string>

#include "source/parquet/metadata.h"

namespace {

void Usage(FILE* out) {
  std::fputs(
      "usage: mmfeed-parquet FILE...\n"
      "Prints each Parquet file's metadata as mmfeed reads it, one JSON object per line: its\n"
      "rows, leaf columns (path, physical and logical type, definition and repetition levels)\n"
      "and row groups (per column chunk: codec, encodings, offsets and sizes). A file mmfeed\n"
      "cannot read is named on stderr with the reason, and the exit status is 1.\n"
      "  -h, --help   this text\n",
      out);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    Usage(stderr);
    return 2;
  }
  int status = 0;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "-h") || !std::strcmp(argv[i], "--help")) {
      Usage(stdout);
      return 0;
    }
    mmfeed::Result<mmfeed::parquet::FileMetaData> m = mmfeed::parquet::ReadFooter(argv[i]);
    if (!m.ok()) {
      std::fprintf(stderr, "mmfeed-parquet: %s\n", m.status().message().c_str());
      status = 1;
      continue;
    }
    std::printf("%s\n", mmfeed::parquet::MetadataJson(*m).c_str());
  }
  return status;
}
