// Thread placement: which CPUs a stage's threads may run on, and pinning the calling thread.
// With `placement: {numa_node: N}` a stage's threads are pinned to the CPUs of node N (libnuma);
// without it, to every CPU the daemon may use. The pinning is always applied, so it shows in
// /proc/<pid>/task/<tid>/status (Cpus_allowed_list). Callable from any thread.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"
#include "engine/config.h"

namespace mmfeed {

int NumaNodeCount();
// The CPUs for `p`, limited to those the process may use. Error if the node does not exist or
// has no usable CPU.
Result<std::vector<int>> CpusFor(const Placement& p);
// "0-3,8" for {0, 1, 2, 3, 8}.
std::string CpuList(const std::vector<int>& cpus);
// Pins the calling thread to `cpus` and names it (at most 15 characters are kept).
Status PinAndNameThisThread(const std::vector<int>& cpus, const std::string& name);

}  // namespace mmfeed
