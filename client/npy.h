// Writes a tensor as a NumPy .npy file (format version 1.0), so anyone can load what a trainer
// received with numpy.load.
#pragma once

#include <string>

#include "shm/ring.h"
#include "stages/runtime/status.h"

namespace mmfeed {

Status WriteNpy(const std::string& path, const shm::TensorView& t);

}  // namespace mmfeed
