#include "client/npy.h"

#include <fmt/format.h>

#include <cstdio>

#include "stages/runtime/tensor.h"

namespace mmfeed {

Status WriteNpy(const std::string& path, const shm::TensorView& t) {
  std::string shape;
  for (size_t i = 0; i < t.shape.size(); ++i) shape += fmt::format("{}, ", t.shape[i]);
  if (t.shape.size() > 1) shape.resize(shape.size() - 2);  // "(2, 3)" but "(2,)"
  else if (t.shape.size() == 1) shape.pop_back();
  std::string header = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': ({}), }}",
                                   DTypeNumpyDescr(static_cast<DType>(t.dtype)), shape);
  size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return Status::Io(fmt::format("cannot write {}", path));
  const unsigned char magic[8] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0};
  uint16_t len = static_cast<uint16_t>(header.size());
  bool ok = std::fwrite(magic, 1, 8, f) == 8 && std::fwrite(&len, 2, 1, f) == 1 &&
            std::fwrite(header.data(), 1, header.size(), f) == header.size() &&
            std::fwrite(t.data, 1, t.nbytes, f) == t.nbytes;
  ok = std::fclose(f) == 0 && ok;
  return ok ? Status::Ok() : Status::Io(fmt::format("writing {} failed", path));
}

}  // namespace mmfeed
