// mmfeed-consume: attaches to mmfeedd like a trainer would and consumes batches.
//
//
// Its command line is in one place, Usage() below: what --help prints and
// docs/reference/cli.md shows.
#include <fcntl.h>
#include <fmt/format.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <thread>

#include "base/atomic_file.h"
#include "base/flags.h"
#include "base/npy.h"
#include "client/client.h"

using namespace mmfeed;

namespace {

[[noreturn]] void Usage(int code) {
  std::fprintf(
      code ? stderr : stdout,
      "usage: mmfeed-consume --socket PATH [--rank R] [--batches N] [--json] [--dump DIR]\n"
      "                      [--cursor FILE] [--reconnect SECONDS] [--hold-ms MS] "
      "[--pause-ms MS]\n"
      "                      [--abort-after N] [--timeout SECONDS]\n"
      "                      [--job NUM_NODES,NODE_RANK,LOCAL_WORLD_SIZE[,REPLICAS]]\n"
      "attaches to mmfeedd as a trainer would and takes its batches.\n"
      "\n"
      "  --socket PATH        the daemon's socket (default $MMFEED_SOCKET)\n"
      "  --rank R             the trainer rank; without it, the launcher's local rank\n"
      "                       ($LOCAL_RANK, $SLURM_LOCALID), and the attach declares the\n"
      "                       launcher's job shape (consumers: auto adopts it)\n"
      "  --job N,R,L[,K]      declare a job by hand: N nodes, this one R, L ranks a node, K\n"
      "                       ranks a model-parallel group (or $MMFEED_REPLICAS)\n"
      "  --batches N          stop after N batches (default: the end of the data)\n"
      "  --json               print one line at the end: batches, samples, seconds,\n"
      "                       samples_per_s, sample_ids_sha256 (over the ids in received\n"
      "                       order, each followed by a newline), batch_us_median\n"
      "  --dump DIR           write DIR/<batch>/<tensor>.npy and DIR/<batch>/meta.json (ids,\n"
      "                       seq, epoch, cursor) for every batch\n"
      "  --cursor FILE        resume from FILE if it exists; after each finished batch,\n"
      "                       replace FILE atomically with its cursor\n"
      "  --reconnect SECONDS  survive a daemon restart: re-attach within SECONDS and resume\n"
      "                       after the last batch received\n"
      "  --hold-ms MS         keep each batch MS ms before releasing it (a trainer's step:\n"
      "                       does the host keep up with it?)\n"
      "  --pause-ms MS        wait MS ms after releasing each batch instead\n"
      "  --abort-after N      exit abruptly after N batches, the last one unreleased (a\n"
      "                       crashed trainer, for tests)\n"
      "  --timeout SECONDS    fail when no batch comes within SECONDS from a daemon that\n"
      "                       lives (stopped, hung); default: wait as long as it lives\n"
      "exit status: 0 the end of the data (or --batches), 1 an error (a daemon that stopped\n"
      "or went away before the end of the data), 2 bad arguments, 3 --abort-after\n");
  std::exit(code);
}

Status Dump(const std::string& dir, uint64_t index, const Batch& b) {
  std::string d = fmt::format("{}/{:06d}", dir, index);
  std::error_code ec;
  std::filesystem::create_directories(d, ec);
  if (ec) return Status::Io(fmt::format("cannot create {}: {}", d, ec.message()));
  for (const auto& t : b.tensors())
    MMFEED_RETURN_IF_ERROR(WriteNpy(fmt::format("{}/{}.npy", d, t.name),
                                    static_cast<DType>(t.dtype), t.shape, t.data, t.nbytes));
  nlohmann::json meta = {{"seq", b.seq()},
                         {"epoch", b.epoch()},
                         {"cursor", CursorToJson(b.cursor())},
                         {"ids", nlohmann::json::array()},
                         {"dtypes", nlohmann::json::object()}};  // bfloat16's .npy holds its bits
  for (auto id : b.ids()) meta["ids"].push_back(std::string(id));
  for (const auto& t : b.tensors()) meta["dtypes"][t.name] = DTypeName(static_cast<DType>(t.dtype));
  std::ofstream(d + "/meta.json") << meta.dump() << "\n";
  return Status::Ok();
}

Result<std::optional<StreamCursor>> ReadCursor(const std::string& path) {
  std::ifstream f(path);
  if (!f) return std::optional<StreamCursor>();
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  Result<StreamCursor> c = CursorFromJson(nlohmann::json::parse(text, nullptr, false));
  if (!c.ok()) return c.status().WithContext(path);
  return std::optional<StreamCursor>(*c);
}

int Fail(const Status& st) {
  std::fprintf(stderr, "mmfeed-consume: %s\n", st.message().c_str());
  return 1;
}

template <typename T>
T Flag(const Result<T>& r) {
  if (!r.ok()) {
    std::fprintf(stderr, "mmfeed-consume: %s\n", r.status().message().c_str());
    Usage(2);
  }
  return r.value();
}

}  // namespace

int main(int argc, char** argv) {
  std::string socket_path = mmfeed::kDefaultSocket, dump, cursor_file;
  if (const char* s = std::getenv("MMFEED_SOCKET")) socket_path = s;
  int rank = -1;
  int64_t max_batches = -1, abort_after = -1, hold_ms = 0, pause_ms = 0;
  int timeout_ms = -1;
  bool json = false;
  std::string job;
  AttachOptions options;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) Usage(2);
      return argv[++i];
    };
    if (a == "--socket")
      socket_path = value();
    else if (a == "--rank")
      rank = static_cast<int>(Flag(ParseInt(a, value(), 0, INT32_MAX)));
    else if (a == "--batches")
      max_batches = Flag(ParseInt(a, value(), 0, INT64_MAX));
    else if (a == "--json")
      json = true;
    else if (a == "--dump")
      dump = value();
    else if (a == "--cursor")
      cursor_file = value();
    else if (a == "--reconnect")
      options.reconnect_s = Flag(ParseDouble(a, value(), 0, 1e6));
    else if (a == "--hold-ms")
      hold_ms = Flag(ParseInt(a, value(), 0, 86400000));
    else if (a == "--pause-ms")
      pause_ms = Flag(ParseInt(a, value(), 0, 86400000));
    else if (a == "--timeout")
      timeout_ms = static_cast<int>(Flag(ParseDouble(a, value(), 0.001, 86400)) * 1000);
    else if (a == "--abort-after")
      abort_after = Flag(ParseInt(a, value(), 0, INT64_MAX));
    else if (a == "--job")
      job = value();
    else
      Usage(a == "--help" ? 0 : 2);
  }
  if (!job.empty()) {
    int nodes = 0, node = 0, per_node = 0, replicas = 0;
    char end = 0;
    const int n =
        std::sscanf(job.c_str(), "%d,%d,%d,%d%c", &nodes, &node, &per_node, &replicas, &end);
    if (rank < 0 || (n != 3 && n != 4)) Usage(2);
    nlohmann::json declared = {{"rank", node * per_node + rank},
                               {"world_size", nodes * per_node},
                               {"local_rank", rank},
                               {"local_world_size", per_node},
                               {"node_rank", node},
                               {"num_nodes", nodes},
                               {"from", "arguments"}};
    if (n == 4) declared["replicas"] = replicas;
    Result<JobShape> shape = JobShape::FromJson(declared);
    if (!shape.ok()) return Fail(shape.status().WithContext("--job"));
    options.job = *shape;
  }
  if (!cursor_file.empty()) {
    Result<std::optional<StreamCursor>> c = ReadCursor(cursor_file);
    if (!c.ok()) return Fail(c.status());
    options.resume = *c;
  }

  auto t0 = std::chrono::steady_clock::now();
  Result<std::unique_ptr<Client>> client = Client::Attach(socket_path, rank, options);
  if (!client.ok()) return Fail(client.status());
  // Freed on every path out (an error returns early: LeakSanitizer once failed a trainer that
  // exited 1 when its daemon was killed, for the context left behind).
  const std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> sha_ctx(EVP_MD_CTX_new(),
                                                                        &EVP_MD_CTX_free);
  EVP_MD_CTX* sha = sha_ctx.get();
  EVP_DigestInit_ex(sha, EVP_sha256(), nullptr);
  uint64_t batches = 0, samples = 0;
  std::vector<double> batch_us;  // per batch: Next() plus the release (waits included)
  using Clock = std::chrono::steady_clock;
  while (max_batches < 0 || static_cast<int64_t>(batches) < max_batches) {
    auto n0 = Clock::now();
    Result<std::shared_ptr<Batch>> got = (*client)->Next(timeout_ms);
    double next_us = std::chrono::duration<double, std::micro>(Clock::now() - n0).count();
    if (!got.ok()) return Fail(got.status());
    std::shared_ptr<Batch> batch = std::move(got.value());  // the only reference: see reset()
    if (!batch) break;
    for (auto id : batch->ids()) {
      EVP_DigestUpdate(sha, id.data(), id.size());
      EVP_DigestUpdate(sha, "\n", 1);
    }
    if (!dump.empty()) {
      Status st = Dump(dump, batches, *batch);
      if (!st.ok()) return Fail(st);
    }
    if (!cursor_file.empty()) {
      Status st = WriteFileAtomically(cursor_file, CursorToJson(batch->cursor()).dump() + "\n");
      if (!st.ok()) return Fail(st);
    }
    ++batches;
    samples += batch->ids().size();
    if (abort_after >= 0 && static_cast<int64_t>(batches) >= abort_after)
      _exit(3);  // holds the slot
    if (hold_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(hold_ms));
    auto r0 = Clock::now();
    batch.reset();
    batch_us.push_back(next_us +
                       std::chrono::duration<double, std::micro>(Clock::now() - r0).count());
    if (pause_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
  }
  double median_us = 0;
  if (!batch_us.empty()) {
    std::nth_element(batch_us.begin(), batch_us.begin() + batch_us.size() / 2, batch_us.end());
    median_us = batch_us[batch_us.size() / 2];
  }
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  unsigned char digest[32];
  unsigned int len = 0;
  EVP_DigestFinal_ex(sha, digest, &len);
  std::string hex;
  for (unsigned i = 0; i < len; ++i) hex += fmt::format("{:02x}", digest[i]);
  if (json) {
    nlohmann::json out = {
        {"batches", batches},       {"samples", samples},
        {"seconds", seconds},       {"samples_per_s", seconds > 0 ? samples / seconds : 0.0},
        {"sample_ids_sha256", hex}, {"batch_us_median", median_us}};
    std::printf("%s\n", out.dump().c_str());
  } else {
    std::printf("rank %d: %lu batches, %lu samples in %.2fs (%.0f samples/s)\n", (*client)->rank(),
                static_cast<unsigned long>(batches), static_cast<unsigned long>(samples), seconds,
                seconds > 0 ? samples / seconds : 0.0);
  }
  return 0;
}
