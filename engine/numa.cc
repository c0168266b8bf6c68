#include "engine/numa.h"

#include <fmt/format.h>
#include <numa.h>
#include <pthread.h>
#include <sched.h>

#include <cstring>

namespace mmfeed {

int NumaNodeCount() { return numa_available() < 0 ? 1 : numa_max_node() + 1; }

Result<std::vector<int>> CpusFor(const Placement& p) {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  sched_getaffinity(0, sizeof(allowed), &allowed);
  std::vector<int> cpus;
  if (p.numa_node < 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
    return cpus;
  }
  if (p.numa_node >= NumaNodeCount())
    return Status::Invalid(
        fmt::format("placement.numa_node {} does not exist; this machine has {} NUMA node(s)",
                    p.numa_node, NumaNodeCount()));
  if (numa_available() < 0) {  // no NUMA support: node 0 is the whole machine
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
    return cpus;
  }
  bitmask* mask = numa_allocate_cpumask();
  numa_node_to_cpus(p.numa_node, mask);
  for (unsigned c = 0; c < mask->size && c < CPU_SETSIZE; ++c)
    if (numa_bitmask_isbitset(mask, c) && CPU_ISSET(c, &allowed))
      cpus.push_back(static_cast<int>(c));
  numa_free_cpumask(mask);
  if (cpus.empty())
    return Status::Invalid(
        fmt::format("NUMA node {} has no CPU this process may use", p.numa_node));
  return cpus;
}

Status PinAndNameThisThread(const std::vector<int>& cpus, const std::string& name) {
  pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
  if (cpus.empty()) return Status::Ok();
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) CPU_SET(c, &set);
  int rc = pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
  if (rc != 0) return Status::Io(fmt::format("pinning thread {}: {}", name, std::strerror(rc)));
  return Status::Ok();
}

std::string CpuList(const std::vector<int>& cpus) {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(cpus[i]);
    if (j > i) out += fmt::format("-{}", cpus[j]);
    i = j + 1;
  }
  return out;
}

}  // namespace mmfeed
