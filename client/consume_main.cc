// mmfeed-consume: attaches to mmfeedd like a trainer would and consumes batches.
//
//   mmfeed-consume --socket PATH --rank R [--batches N] [--json] [--dump DIR]
//                  [--hold-ms MS] [--abort-after N]
//
// --json prints one line: {"batches":..,"samples":..,"seconds":..,"samples_per_s":..,
// "sample_ids_sha256":".."} (the hash is over the sample ids in received order, each followed
// by '\n'). --dump writes DIR/<batch>/<tensor>.npy and DIR/<batch>/meta.json per batch.
// --hold-ms simulates a slow trainer; --abort-after exits abruptly after N batches without
// releasing the last one (tests use it to play a crashed trainer).
#include <fmt/format.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "client/client.h"
#include "base/npy.h"

using namespace mmfeed;

namespace {

[[noreturn]] void Usage(int code) {
  std::fprintf(stderr,
               "usage: mmfeed-consume --socket PATH --rank R [--batches N] [--json] [--dump DIR]\n"
               "                      [--hold-ms MS] [--abort-after N]\n");
  std::exit(code);
}

Status Dump(const std::string& dir, uint64_t index, const ClientBatch& b) {
  std::string d = fmt::format("{}/{:06d}", dir, index);
  std::error_code ec;
  std::filesystem::create_directories(d, ec);
  if (ec) return Status::Io(fmt::format("cannot create {}: {}", d, ec.message()));
  for (const auto& t : b.tensors()) MMFEED_RETURN_IF_ERROR(
        WriteNpy(fmt::format("{}/{}.npy", d, t.name), static_cast<DType>(t.dtype), t.shape, t.data, t.nbytes));
  nlohmann::json meta = {{"seq", b.seq()}, {"epoch", b.epoch()}, {"ids", nlohmann::json::array()}};
  for (auto id : b.ids()) meta["ids"].push_back(std::string(id));
  std::ofstream(d + "/meta.json") << meta.dump() << "\n";
  return Status::Ok();
}

}  // namespace

int main(int argc, char** argv) {
  std::string socket_path = "/tmp/mmfeed.sock", dump;
  if (const char* s = std::getenv("MMFEED_SOCKET")) socket_path = s;
  int rank = -1;
  long max_batches = -1, abort_after = -1, hold_ms = 0;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) Usage(2);
      return argv[++i];
    };
    if (a == "--socket") socket_path = value();
    else if (a == "--rank") rank = std::stoi(value());
    else if (a == "--batches") max_batches = std::stol(value());
    else if (a == "--json") json = true;
    else if (a == "--dump") dump = value();
    else if (a == "--hold-ms") hold_ms = std::stol(value());
    else if (a == "--abort-after") abort_after = std::stol(value());
    else Usage(a == "--help" ? 0 : 2);
  }
  if (rank < 0) Usage(2);

  auto t0 = std::chrono::steady_clock::now();
  Result<std::unique_ptr<Client>> client = Client::Attach(socket_path, rank);
  if (!client.ok()) {
    std::fprintf(stderr, "mmfeed-consume: %s\n", client.status().message().c_str());
    return 1;
  }
  EVP_MD_CTX* sha = EVP_MD_CTX_new();
  EVP_DigestInit_ex(sha, EVP_sha256(), nullptr);
  uint64_t batches = 0, samples = 0;
  ClientBatch batch;
  while (max_batches < 0 || static_cast<long>(batches) < max_batches) {
    Result<bool> got = (*client)->Next(&batch);
    if (!got.ok()) {
      std::fprintf(stderr, "mmfeed-consume: %s\n", got.status().message().c_str());
      return 1;
    }
    if (!*got) break;
    for (auto id : batch.ids()) {
      EVP_DigestUpdate(sha, id.data(), id.size());
      EVP_DigestUpdate(sha, "\n", 1);
    }
    if (!dump.empty()) {
      Status st = Dump(dump, batches, batch);
      if (!st.ok()) {
        std::fprintf(stderr, "mmfeed-consume: %s\n", st.message().c_str());
        return 1;
      }
    }
    ++batches;
    samples += batch.ids().size();
    if (abort_after >= 0 && static_cast<long>(batches) >= abort_after) _exit(3);  // holds the slot
    if (hold_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(hold_ms));
    batch.Release();
  }
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  unsigned char digest[32];
  unsigned int len = 0;
  EVP_DigestFinal_ex(sha, digest, &len);
  EVP_MD_CTX_free(sha);
  std::string hex;
  for (unsigned i = 0; i < len; ++i) hex += fmt::format("{:02x}", digest[i]);
  if (json) {
    nlohmann::json out = {{"batches", batches}, {"samples", samples}, {"seconds", seconds},
                          {"samples_per_s", seconds > 0 ? samples / seconds : 0.0}, {"sample_ids_sha256", hex}};
    std::printf("%s\n", out.dump().c_str());
  } else {
    std::printf("rank %d: %lu batches, %lu samples in %.2fs (%.0f samples/s)\n", rank,
                static_cast<unsigned long>(batches), static_cast<unsigned long>(samples), seconds,
                seconds > 0 ? samples / seconds : 0.0);
  }
  return 0;
}
