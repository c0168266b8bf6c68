// Writes a tensor as a NumPy .npy file (format version 1.0), so anyone can load what a trainer
// received with numpy.load.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "base/tensor.h"

namespace mmfeed {

// `nbytes` bytes at `data`: a C-order array of `shape` and `dtype`.
Status WriteNpy(const std::string& path, DType dtype, const std::vector<int64_t>& shape,
                const void* data, uint64_t nbytes);

}  // namespace mmfeed
