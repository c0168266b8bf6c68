// mmfeed-consume: attaches to mmfeedd like a trainer would and consumes batches.
//
//   mmfeed-consume --socket PATH [--rank R] [--batches N] [--json] [--dump DIR]
//                  [--cursor FILE] [--reconnect SECONDS] [--hold-ms MS] [--pause-ms MS]
//                  [--abort-after N] [--timeout SECONDS]
//                  [--job NUM_NODES,NODE_RANK,LOCAL_WORLD_SIZE[,REPLICAS]]
//
// Without --rank the rank is the launcher's local rank (torchrun's or Slurm's variables, as
// the client library reads them), and the attach declares the launcher's job shape; --job
// declares one explicitly (with --rank, the local rank): a daemon with `consumers: auto`
// adopts the first shape declared; REPLICAS (or $MMFEED_REPLICAS) declares the model-parallel
// group size, which `replicas: auto` adopts.
// --json prints one line: {"batches":..,"samples":..,"seconds":..,"samples_per_s":..,
// "sample_ids_sha256":"..","batch_us_median":..} (the hash is over the sample ids in received
// order, each followed by '\n'; batch_us_median is the median time of Next() plus the release,
// waits included). --dump writes DIR/<batch>/<tensor>.npy and DIR/<batch>/meta.json per batch.
// --cursor resumes from FILE if it exists and, after each finished batch (after --dump wrote
// it), atomically replaces FILE with that batch's cursor {"seq":..,"epoch":..,"batch":..}.
// --reconnect survives a daemon restart: the client re-attaches and resumes after the last
// batch it received. --hold-ms simulates a trainer's step time: it keeps each batch MS ms before
// releasing it (how a user checks, before a run, whether the host keeps up with a step time).
// --pause-ms waits MS ms after releasing each batch instead (a trainer that copies its batch
// out and releases it at once, then computes). --abort-after exits abruptly after N batches
// without releasing the last one (tests use it to play a crashed trainer). --timeout fails
// (exit 1) when no batch arrives within SECONDS while the daemon lives (a stopped or hung
// daemon); without it the consumer waits as long as the daemon does.
// Exit status: 0 at the end of the data (or after --batches), 1 on an error, including a
// daemon that stopped before the end of the data, 2 on bad arguments.
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
      stderr,
      "usage: mmfeed-consume --socket PATH [--rank R] [--batches N] [--json] [--dump DIR]\n"
      "                      [--cursor FILE] [--reconnect SECONDS] [--hold-ms MS] "
      "[--pause-ms MS]\n"
      "                      [--abort-after N] [--timeout SECONDS]\n"
      "                      [--job NUM_NODES,NODE_RANK,LOCAL_WORLD_SIZE[,REPLICAS]]\n"
      "without --rank: the launcher's local rank ($LOCAL_RANK, $SLURM_LOCALID)\n");
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
  EVP_MD_CTX* sha = EVP_MD_CTX_new();
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
  EVP_MD_CTX_free(sha);
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
