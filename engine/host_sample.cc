#include "engine/host_sample.h"

#include <dirent.h>
#include <fmt/format.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace mmfeed {
namespace {

std::string ReadSmallFile(const std::string& path) {
  std::ifstream f(path);
  if (!f) return "";
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The fields after the command name of a /proc stat line (whose name may hold spaces and
// parentheses): field 3 of proc(5) is element 0.
std::vector<std::string> StatFields(const std::string& stat) {
  std::vector<std::string> out;
  size_t close = stat.rfind(')');
  if (close == std::string::npos) return out;
  std::istringstream in(stat.substr(close + 1));
  for (std::string f; in >> f;) out.push_back(f);
  return out;
}

uint64_t ToU64(const std::vector<std::string>& f, size_t i) {
  return i < f.size() ? std::strtoull(f[i].c_str(), nullptr, 10) : 0;
}

// "key: N kB" lines of /proc/self/status and /proc/meminfo.
uint64_t KbField(const std::string& text, const std::string& key) {
  size_t at = text.find("\n" + key + ":");
  if (at == std::string::npos) at = text.rfind(key + ":", 0) == 0 ? 0 : std::string::npos;
  if (at == std::string::npos) return 0;
  at = text.find(':', at);
  return std::strtoull(text.c_str() + at + 1, nullptr, 10) * 1024;
}

// "key: N" lines of /proc/self/io.
uint64_t IoField(const std::string& text, const std::string& key) {
  size_t at = text.find(key + ": ");
  return at == std::string::npos ? 0
                                 : std::strtoull(text.c_str() + at + key.size() + 2, nullptr, 10);
}

double PressureSomeTotalUs(const char* resource) {
  std::string text = ReadSmallFile(fmt::format("/proc/pressure/{}", resource));
  size_t at = text.find("some ");
  if (at == std::string::npos) return -1;
  at = text.find("total=", at);
  if (at == std::string::npos) return -1;
  return static_cast<double>(std::strtoull(text.c_str() + at + 6, nullptr, 10));
}

}  // namespace

ProcessSample SampleProcess() {
  ProcessSample p;
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  p.cpu_ns = static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + ts.tv_nsec;
  std::vector<std::string> f = StatFields(ReadSmallFile("/proc/self/stat"));
  p.minor_faults = ToU64(f, 7);  // fields 10 and 12 of proc(5)
  p.major_faults = ToU64(f, 9);
  std::string status = ReadSmallFile("/proc/self/status");
  p.rss_bytes = KbField(status, "VmRSS");
  p.rss_anon_bytes = KbField(status, "RssAnon");
  std::string io = ReadSmallFile("/proc/self/io");
  p.read_bytes = IoField(io, "rchar");
  p.read_syscalls = IoField(io, "syscr");
  p.storage_read_bytes = IoField(io, "read_bytes");
  return p;
}

uint64_t MemAvailableBytes() { return KbField(ReadSmallFile("/proc/meminfo"), "MemAvailable"); }

HostSample SampleHost(const std::map<int, std::string>& thread_stages) {
  HostSample h;
  static_cast<ProcessSample&>(h) = SampleProcess();
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
      ThreadSample t;
      t.tid = std::atoi(e->d_name);
      const std::string dir = fmt::format("/proc/self/task/{}/", e->d_name);
      std::string stat = ReadSmallFile(dir + "stat");
      size_t open = stat.find('('), close = stat.rfind(')');
      if (open == std::string::npos || close == std::string::npos) continue;  // exited
      t.name = stat.substr(open + 1, close - open - 1);
      std::vector<std::string> f = StatFields(stat);
      t.minor_faults = ToU64(f, 7);  // fields 10 and 12 of proc(5)
      t.major_faults = ToU64(f, 9);
      // schedstat's first field is the thread's CPU time in ns (finer than stat's ticks).
      t.cpu_ns = std::strtoull(ReadSmallFile(dir + "schedstat").c_str(), nullptr, 10);
      if (auto it = thread_stages.find(t.tid); it != thread_stages.end()) t.stage = it->second;
      h.threads.push_back(std::move(t));
    }
    closedir(d);
  }
  h.pressure_us = {PressureSomeTotalUs("cpu"), PressureSomeTotalUs("io"),
                   PressureSomeTotalUs("memory")};
  h.mem_available_bytes = MemAvailableBytes();
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) h.cpus = std::max(1, CPU_COUNT(&set));
  // "cpu  user nice system idle iowait ..." in clock ticks, all CPUs together.
  std::istringstream stat(ReadSmallFile("/proc/stat"));
  std::string cpu;
  unsigned long long user, nice, system, idle, iowait;
  if (stat >> cpu >> user >> nice >> system >> idle >> iowait && cpu == "cpu")
    h.idle_cpu_ns = static_cast<double>(idle + iowait) * 1e9 / sysconf(_SC_CLK_TCK);
  return h;
}

uint64_t AvailableBytes() {
  uint64_t avail = MemAvailableBytes();
  if (avail == 0) avail = UINT64_MAX;  // unknown
  std::ifstream max("/sys/fs/cgroup/memory.max"), cur("/sys/fs/cgroup/memory.current");
  std::string limit;
  uint64_t used = 0;
  if (max >> limit && limit != "max" && cur >> used) {
    uint64_t l = std::stoull(limit);
    avail = std::min(avail, l > used ? l - used : 0);
  }
  return avail;
}

}  // namespace mmfeed
