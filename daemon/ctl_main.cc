// mmfeedctl: talks to a running mmfeedd.
//
//   mmfeedctl [--socket PATH] [--timeout SECONDS] status [--json]   profile, consumers, errors
//   mmfeedctl [--socket PATH] [--timeout SECONDS] reload [--config FILE] [--json]
//                                  check FILE (default: the running config's) and swap it in;
//                                  exit 1 with the daemon's reason (file:line:col) if refused
//   mmfeedctl [--socket PATH] [--timeout SECONDS] stop              drain and exit
// A daemon that does not answer within the timeout (default 10 s) is an error, exit 1.
#include <cstdio>
#include <filesystem>
#include <string>

#include "base/flags.h"
#include "client/client.h"
#include "stages/runtime/profile.h"

using namespace mmfeed;

namespace {

int Usage() {
  std::fprintf(stderr,
               "usage: mmfeedctl [--socket PATH] [--timeout SECONDS] status [--json]\n"
               "       mmfeedctl [--socket PATH] [--timeout SECONDS] reload [--config FILE] "
               "[--json]\n"
               "       mmfeedctl [--socket PATH] [--timeout SECONDS] stop\n");
  return 2;
}

void PrintStatus(const nlohmann::json& s) {
  std::printf("pipeline %s (pid %d): %s\n", s["pipeline"].get<std::string>().c_str(),
              s["pid"].get<int>(), s["state"].get<std::string>().c_str());
  std::printf("config %s; reloads: %lu ok, %lu refused%s\n", s["config"].get<std::string>().c_str(),
              static_cast<unsigned long>(s["reloads"]["ok"].get<uint64_t>()),
              static_cast<unsigned long>(s["reloads"]["failed"].get<uint64_t>()),
              s["reloads"]["pending"].get<bool>() ? ", one waiting for the epoch boundary" : "");
  for (const auto& r : s["consumers"])
    std::printf("  rank %d: %s, %lu published, %lu released\n", r["rank"].get<int>(),
                r["attached"].get<bool>() ? ("pid " + std::to_string(r["pid"].get<int>())).c_str()
                                          : "not attached",
                static_cast<unsigned long>(r["published"].get<uint64_t>()),
                static_cast<unsigned long>(r["released"].get<uint64_t>()));
  const auto& rings = s["rings"];
  int node = rings["numa_node"].get<int>();
  std::printf("rings: %.2f GiB, %d slots per rank, %s\n",
              rings["bytes"].get<uint64_t>() / 1073741824.0, rings["slots"].get<int>(),
              node >= 0 ? ("bound to NUMA node " + std::to_string(node)).c_str() : "not bound");
  for (const auto& p : s["placement"])
    std::printf("  %-14s %2d thread(s) on CPUs %s\n", p["stage"].get<std::string>().c_str(),
                p["threads"].get<int>(), p["cpus"].get<std::string>().c_str());
  std::printf("%s", FormatProfile(s["profile"]).c_str());
  std::printf("errors: %lu\n",
              static_cast<unsigned long>(s["profile"]["errors"]["total"].get<uint64_t>()));
}

}  // namespace

int main(int argc, char** argv) {
  std::string socket_path = "/tmp/mmfeed.sock", cmd, config;
  if (const char* s = std::getenv("MMFEED_SOCKET")) socket_path = s;
  bool json = false;
  double timeout_s = 10;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--socket" && i + 1 < argc)
      socket_path = argv[++i];
    else if (a == "--timeout" && i + 1 < argc) {
      Result<double> t = ParseDouble(a, argv[++i], 0.001, 86400);
      if (!t.ok()) {
        std::fprintf(stderr, "mmfeedctl: %s\n", t.status().message().c_str());
        return 2;
      }
      timeout_s = *t;
    } else if (a == "--json")
      json = true;
    else if (a == "--config" && i + 1 < argc && cmd == "reload")
      config = argv[++i];
    else if (cmd.empty() && (a == "status" || a == "stop" || a == "reload"))
      cmd = a;
    else
      return Usage();
  }
  if (cmd.empty()) return Usage();
  nlohmann::json request = {{"cmd", cmd}};
  if (!config.empty()) {
    // The daemon runs elsewhere: the path is made absolute here.
    std::error_code ec;
    std::filesystem::path abs = std::filesystem::absolute(config, ec);
    request["config"] = ec ? config : abs.lexically_normal().string();
  }
  Result<nlohmann::json> reply =
      ControlRequest(socket_path, request, static_cast<int>(timeout_s * 1000));
  if (!reply.ok()) {
    std::fprintf(stderr, "mmfeedctl: %s\n", reply.status().message().c_str());
    return 1;
  }
  if (cmd == "stop") {
    std::printf("stopping\n");
    return 0;
  }
  if (cmd == "reload") {
    const nlohmann::json& r = (*reply)["reload"];
    if (json)
      std::printf("%s\n", r.dump(2).c_str());
    else
      std::printf("reloaded %s: %s; applied %s\n", r["config"].get<std::string>().c_str(),
                  r["summary"].get<std::string>().c_str(), r["applied"].get<std::string>().c_str());
    return 0;
  }
  if (json)
    std::printf("%s\n", (*reply)["status"].dump(2).c_str());
  else
    PrintStatus((*reply)["status"]);
  return 0;
}
