#include "base/npy.h"

#include <fmt/format.h>

#include <cstdio>

namespace mmfeed {

Status WriteNpy(const std::string& path, DType dtype, const std::vector<int64_t>& dims,
                const void* data, uint64_t nbytes) {
  std::string shape;
  for (size_t i = 0; i < dims.size(); ++i) shape += fmt::format("{}, ", dims[i]);
  if (dims.size() > 1)
    shape.resize(shape.size() - 2);  // "(2, 3)" but "(2,)"
  else if (dims.size() == 1)
    shape.pop_back();
  std::string header = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': ({}), }}",
                                   DTypeNumpyDescr(dtype), shape);
  size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return Status::Io(fmt::format("cannot write {}", path));
  const unsigned char magic[8] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0};
  uint16_t len = static_cast<uint16_t>(header.size());
  bool ok = std::fwrite(magic, 1, 8, f) == 8 && std::fwrite(&len, 2, 1, f) == 1 &&
            std::fwrite(header.data(), 1, header.size(), f) == header.size() &&
            std::fwrite(data, 1, nbytes, f) == nbytes;
  ok = std::fclose(f) == 0 && ok;
  return ok ? Status::Ok() : Status::Io(fmt::format("writing {} failed", path));
}

}  // namespace mmfeed
