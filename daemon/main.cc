// mmfeedd: the mmfeed daemon. Loads a pipeline graph, runs it, and serves batches to trainer
// processes through shared-memory rings. See README.md and docs/design/threads.md; the lifecycle is
// in daemon/supervisor.h.
//
//
// Its command line is in one place, Usage() below: what --help prints and
// docs/reference/cli.md shows.
#include <fmt/format.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <cstdlib>

#include "base/flags.h"
#include "base/malloc_tuning.h"
#include "daemon/supervisor.h"
#include "engine/config.h"
#include "engine/config_schema.h"
#include "engine/registry.h"

namespace mmfeed {
namespace {

struct Options {
  std::string config, log_level = "info";
  bool check = false, list_stages = false, schema = false;
  SupervisorOptions daemon;
};

[[noreturn]] void Usage(int code) {
  std::fprintf(
      code ? stderr : stdout,
      "usage: mmfeedd --config FILE [--socket PATH] [--socket-group GROUP] [--state-dir DIR]\n"
      "               [--drain-timeout SECONDS] [--job-lease SECONDS] [--log-level LEVEL]\n"
      "               [--allow-faults]\n"
      "       mmfeedd --check FILE [--allow-faults]   (or --check --config FILE)\n"
      "       mmfeedd --list-stages\n"
      "       mmfeedd --schema\n"
      "\n"
      "  --config FILE          run the pipeline of FILE (YAML; docs/reference/config.md)\n"
      "  --check FILE           build the pipeline without starting it, open a spread of its\n"
      "                         sample files, print the settings in force: exit 0, or 2 with\n"
      "                         the reason as file:line:col (FILE may stand anywhere)\n"
      "  --socket PATH          the control socket trainers attach to (default $MMFEED_SOCKET,\n"
      "                         else /tmp/mmfeed.sock); at most 107 characters\n"
      "  --socket-group GROUP   members of GROUP may attach too (the socket becomes 0660)\n"
      "  --state-dir DIR        keep each rank's cursor and the stream's config in\n"
      "                         DIR/cursors.json, and indexes there: a restart continues\n"
      "  --drain-timeout S      on stop, wait at most S seconds (default 30) for attached\n"
      "                         trainers to take the published batches\n"
      "  --job-lease S          consumers: auto: a job none of whose trainers is attached for\n"
      "                         S seconds (default 120) ends, cursors kept; 0: never\n"
      "  --log-level LEVEL      trace, debug, info (default), warn, error\n"
      "  --allow-faults         accept a config's faults: (injected faults, for tests)\n"
      "  --list-stages          every stage type with its parameters, types and defaults\n"
      "  --schema               the config's JSON Schema (draft 2020-12), for editors\n"
      "  --help                 this text\n"
      "exit status: 0 done (a finite run taken whole, or stopped), 1 on_error: fail or no\n"
      "memory for the rings, 2 a bad config or unusable data, 3 the drain timed out with\n"
      "batches attached trainers never took\n");
  std::exit(code);
}

Options ParseArgs(int argc, char** argv) {
  Options o;
  if (const char* s = std::getenv("MMFEED_SOCKET")) o.daemon.socket = s;
  // --check's file may stand anywhere among the flags (`--check FILE`, `FILE --check`,
  // `--check --allow-faults FILE`), or come as --config FILE: one file either way.
  std::string file;
  auto config = [&](const std::string& f) {
    if (!o.config.empty() && o.config != f) {
      std::fprintf(stderr, "mmfeedd: two configs given ('%s' and '%s'): name one\n", f.c_str(),
                   o.config.c_str());
      Usage(kExitConfig);
    }
    o.config = f;
  };
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) Usage(kExitConfig);
      return argv[++i];
    };
    if (a == "--config")
      config(value());
    else if (a == "--check")
      o.check = true;
    else if (a == "--socket")
      o.daemon.socket = value();
    else if (a == "--socket-group")
      o.daemon.socket_group = value();
    else if (a == "--state-dir")
      o.daemon.state_dir = value();
    else if (a == "--drain-timeout") {
      Result<double> v = ParseDouble(a, value(), 0, 86400);
      if (!v.ok()) {
        std::fprintf(stderr, "mmfeedd: %s\n", v.status().message().c_str());
        Usage(kExitConfig);
      }
      o.daemon.drain_timeout = *v;
    } else if (a == "--job-lease") {
      Result<double> v = ParseDouble(a, value(), 0, 30 * 86400);
      if (!v.ok()) {
        std::fprintf(stderr, "mmfeedd: %s\n", v.status().message().c_str());
        Usage(kExitConfig);
      }
      o.daemon.job_lease = *v;
    } else if (a == "--log-level")
      o.log_level = value();
    else if (a == "--allow-faults")  // configs may inject faults (`faults:`): for tests only
      o.daemon.allow_faults = true;
    else if (a == "--list-stages")
      o.list_stages = true;
    else if (a == "--schema")
      o.schema = true;
    else if (a == "--help" || a == "-h")
      Usage(0);
    else if (a.rfind("-", 0) != 0 && file.empty())
      file = a;
    else {
      std::fprintf(stderr, "mmfeedd: unknown argument '%s'\n", a.c_str());
      Usage(kExitConfig);
    }
  }
  if (!file.empty()) {
    if (!o.check) {
      std::fprintf(stderr, "mmfeedd: a bare file ('%s') is --check's; to run it: --config %s\n",
                   file.c_str(), file.c_str());
      Usage(kExitConfig);
    }
    config(file);
  }
  if (!o.list_stages && !o.schema && o.config.empty()) Usage(kExitConfig);
  return o;
}

}  // namespace
}  // namespace mmfeed

int main(int argc, char** argv) {
  using namespace mmfeed;
  KeepSampleMemoryOnTheHeap();
  Options opt = ParseArgs(argc, argv);
  spdlog::set_default_logger(spdlog::stderr_color_mt("mmfeedd"));
  spdlog::set_level(spdlog::level::from_str(opt.log_level));
  spdlog::set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
  if (opt.list_stages) {
    std::fputs(Registry::Get().Describe().c_str(), stdout);
    return 0;
  }
  if (opt.schema) {
    std::printf("%s\n", ConfigSchema().dump(2).c_str());
    return 0;
  }
  const std::string& file = opt.config;
  Result<PipelineConfig> cfg = LoadDaemonConfig(file, opt.daemon);
  if (!cfg.ok()) {
    std::fprintf(stderr, "%s\n", cfg.status().message().c_str());
    return kExitConfig;
  }
  if (!cfg->faults.stage.empty())
    spdlog::warn("faults injected into stage {}: read_delay_ms {}, leak_bytes_per_item {}",
                 cfg->faults.stage, cfg->faults.read_delay_ms, cfg->faults.leak_bytes_per_item);
  if (opt.check) {
    Result<std::string> summary = CheckPipeline(*cfg);
    if (!summary.ok()) {
      std::fprintf(stderr, "%s\n", summary.status().message().c_str());
      return kExitConfig;
    }
    // One line per item, each ended, and flushed before anything else can be written.
    std::string text = fmt::format("{}: ok {}", file, *summary);
    while (!text.empty() && text.back() == '\n') text.pop_back();
    std::printf("%s\n", text.c_str());
    std::fflush(stdout);
    return 0;
  }
  return RunSupervisor(std::move(cfg.value()), opt.daemon);
}
