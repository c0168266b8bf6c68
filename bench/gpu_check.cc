// mmfeed-gpu-check: the last hop measured on a real GPU, in one run (bench/gpu_check.sh builds
// it with shm/, the client and the feeder only: no FFmpeg, OpenCV or yaml-cpp).
//
// A synthetic ring producer in this process plays mmfeedd: it answers the client's attach on a
// unix socket (the real protocol: JSON line, the two ring fds with SCM_RIGHTS) and publishes
// batches of one uint8 tensor as fast as slots free up. Then:
//   1. host-to-device GB/s from a registered ring slot vs a cudaMallocHost buffer of the same
//      size (target: at least 0.9) vs pageable memory;
//   2. a mock training loop (a kernel of fixed duration per batch): the data stall per step
//      with the feeder (double-buffered copies) vs a loop that copies then computes.
//
// usage: mmfeed-gpu-check [--batch-mib N] [--steps N] [--kernel-ms MS]
#include <fmt/format.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "client/client.h"
#include "client/cuda_feeder.h"
#include "shm/ring.h"

using namespace mmfeed;

// bench/gpu_check_spin.cu: a kernel that runs `cycles` GPU clock cycles (the mock training step).
cudaError_t LaunchSpin(long long cycles, cudaStream_t stream);

namespace {

#define CHECK_CUDA(call)                                              \
  do {                                                                \
    cudaError_t e_ = (call);                                          \
    if (e_ != cudaSuccess) {                                          \
      std::fprintf(stderr, "%s\n", CudaErrorText(#call, e_).c_str()); \
      std::exit(1);                                                   \
    }                                                                 \
  } while (0)

[[noreturn]] void Die(const std::string& why) {
  std::fprintf(stderr, "mmfeed-gpu-check: %s\n", why.c_str());
  std::exit(1);
}

// Plays mmfeedd for one rank: serves attaches on `path`, publishes batches until stopped.
class Producer {
 public:
  Producer(std::string path, uint64_t batch_bytes) : path_(std::move(path)), bytes_(batch_bytes) {
    auto w = shm::RingWriter::Create(0, 1, 4, shm::PlanSlot(64, {batch_bytes}));
    if (!w.ok()) Die(w.status().message());
    ring_ = std::move(w.value());
    listen_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, path_.c_str(), sizeof(a.sun_path) - 1);
    unlink(path_.c_str());
    if (bind(listen_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || listen(listen_, 4) != 0)
      Die(fmt::format("socket {}: {}", path_, std::strerror(errno)));
    serve_ = std::thread([this] { Serve(); });
    publish_ = std::thread([this] { Publish(); });
  }
  ~Producer() {
    stop_ = true;
    shutdown(listen_, SHUT_RDWR);
    serve_.join();
    publish_.join();
    for (int fd : conns_) close(fd);
    close(listen_);
    unlink(path_.c_str());
  }

 private:
  void Serve() {
    for (uint32_t generation = 1; !stop_; ++generation) {
      int c = accept4(listen_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) return;
      char buf[4096];
      ssize_t n = read(c, buf, sizeof buf);  // {"cmd":"attach",...}\n
      if (n <= 0) {
        close(c);
        continue;
      }
      ring_->Detach();
      Result<int> control = ring_->Attach(generation);
      if (!control.ok()) Die(control.status().message());
      std::string reply = nlohmann::json{{"ok", true},
                                         {"rank", 0},
                                         {"generation", generation},
                                         {"ring_bytes", ring_->size()},
                                         {"consumers", 1},
                                         {"pipeline", "synthetic"}}
                              .dump() +
                          "\n";
      int fds[2] = {ring_->data_fd(), *control};
      iovec iov{reply.data(), reply.size()};
      alignas(cmsghdr) char cbuf[CMSG_SPACE(sizeof fds)];
      msghdr msg{};
      msg.msg_iov = &iov;
      msg.msg_iovlen = 1;
      msg.msg_control = cbuf;
      msg.msg_controllen = sizeof cbuf;
      cmsghdr* cm = CMSG_FIRSTHDR(&msg);
      cm->cmsg_level = SOL_SOCKET;
      cm->cmsg_type = SCM_RIGHTS;
      cm->cmsg_len = CMSG_LEN(sizeof fds);
      std::memcpy(CMSG_DATA(cm), fds, sizeof fds);
      if (sendmsg(c, &msg, MSG_NOSIGNAL) < 0) Die(std::strerror(errno));
      conns_.push_back(c);  // kept open: the trainer stays attached
    }
  }

  void Publish() {
    for (uint64_t seq = 0; !stop_;) {
      int slot = ring_->AcquireFree(10);
      if (slot < 0) continue;
      uint8_t* data = ring_->slot_data(slot) + ring_->layout().tensor_offsets[0];
      data[0] = static_cast<uint8_t>(seq);  // the rest keeps what an earlier batch wrote
      shm::BatchView v;
      v.seq = seq;
      std::string id = fmt::format("b{}", seq);
      v.ids.push_back(id);
      v.tensors.push_back({"payload", 1, {static_cast<int64_t>(bytes_)}, nullptr, bytes_});
      v.next.seq = ++seq;
      Status st = ring_->Commit(slot, v);
      if (!st.ok()) Die(st.message());
    }
  }

  std::string path_;
  uint64_t bytes_;
  std::unique_ptr<shm::RingWriter> ring_;
  int listen_ = -1;
  std::vector<int> conns_;
  std::atomic<bool> stop_{false};
  std::thread serve_, publish_;
};

// GB/s of `reps` host-to-device copies of `bytes` from `src`.
double CopyGBps(const void* src, void* dst, uint64_t bytes, int reps, cudaStream_t s) {
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s));  // warm
  CHECK_CUDA(cudaEventRecord(a, s));
  for (int i = 0; i < reps; ++i)
    CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s));
  CHECK_CUDA(cudaEventRecord(b, s));
  CHECK_CUDA(cudaEventSynchronize(b));
  float ms = 0;
  CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return static_cast<double>(bytes) * reps / (ms / 1e3) / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t batch_mib = 64;
  int steps = 200;
  double kernel_ms = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--batch-mib")
      batch_mib = std::strtoull(argv[i + 1], nullptr, 10);
    else if (a == "--steps")
      steps = std::atoi(argv[i + 1]);
    else if (a == "--kernel-ms")
      kernel_ms = std::atof(argv[i + 1]);
    else
      Die("usage: mmfeed-gpu-check [--batch-mib N] [--steps N] [--kernel-ms MS]");
  }
  Status gpu = CudaAvailable();
  if (!gpu.ok()) Die(gpu.message());
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  int clock_khz = 0;
  CHECK_CUDA(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  const uint64_t bytes = batch_mib << 20;
  std::printf("GPU: %s (CUDA runtime %d), batches of %lu MiB\n", prop.name, CUDART_VERSION,
              static_cast<unsigned long>(batch_mib));

  const std::string sock = fmt::format("/tmp/mmfeed-gpu-check-{}.sock", getpid());
  Producer producer(sock, bytes);
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  void* dev;
  CHECK_CUDA(cudaMalloc(&dev, bytes));

  // 1. Bandwidth: a registered ring slot vs cudaMallocHost vs pageable, the same bytes.
  double ring_gbps = 0;
  {
    auto client = Client::Attach(sock, 0);
    if (!client.ok()) Die(client.status().message());
    auto b = (*client)->Next(10000);
    if (!b.ok() || !*b) Die("no batch from the synthetic producer");
    Batch::Mapping m = (*b)->mapping();
    CHECK_CUDA(cudaHostRegister(const_cast<void*>(m.base), m.size,
                                cudaHostRegisterPortable | cudaHostRegisterReadOnly));
    ring_gbps = CopyGBps((*b)->tensors()[0].data, dev, bytes, 20, stream);
    CHECK_CUDA(cudaHostUnregister(const_cast<void*>(m.base)));
  }
  void* pinned;
  CHECK_CUDA(cudaMallocHost(&pinned, bytes));
  std::memset(pinned, 1, bytes);
  const double pinned_gbps = CopyGBps(pinned, dev, bytes, 20, stream);
  cudaFreeHost(pinned);
  std::vector<uint8_t> pageable(bytes, 1);
  const double pageable_gbps = CopyGBps(pageable.data(), dev, bytes, 20, stream);
  std::printf(
      "host-to-device: registered ring %.1f GB/s, cudaMallocHost %.1f GB/s, pageable "
      "%.1f GB/s\n",
      ring_gbps, pinned_gbps, pageable_gbps);
  std::printf("  ring / cudaMallocHost = %.2f (target >= 0.90); ring / pageable = %.2f\n",
              ring_gbps / pinned_gbps, ring_gbps / pageable_gbps);

  // 2. A mock training loop: a kernel of kernel_ms per batch. Data stall: the step time beyond
  // the kernel's.
  const long long cycles = static_cast<long long>(kernel_ms * 1e-3 * clock_khz * 1e3);
  cudaStream_t compute;
  CHECK_CUDA(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  auto run = [&](bool feeder) {
    auto client = Client::Attach(sock, 0);
    if (!client.ok()) Die(client.status().message());
    std::unique_ptr<CudaFeeder> f;
    if (feeder) {
      CudaFeeder::Options options;
      options.consumer_stream = compute;
      auto created = CudaFeeder::Create(client->get(), options);
      if (!created.ok()) Die(created.status().message());
      f = std::move(created.value());
    }
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < steps; ++i) {
      if (feeder) {
        auto b = f->Next(10000);
        if (!b.ok() || !*b) Die("feeder: " + b.status().message());
      } else {  // copy, then compute: the copy is on the step's critical path
        auto b = (*client)->Next(10000);
        if (!b.ok() || !*b) Die(b.status().message());
        CHECK_CUDA(
            cudaMemcpyAsync(dev, (*b)->tensors()[0].data, bytes, cudaMemcpyHostToDevice, compute));
        CHECK_CUDA(cudaStreamSynchronize(compute));  // the batch may be released after this
      }
      CHECK_CUDA(LaunchSpin(cycles, compute));
      CHECK_CUDA(cudaStreamSynchronize(compute));  // the training step ends
    }
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (f && !f->stats().registration_error.empty())
      std::printf("  feeder: %s\n", f->stats().registration_error.c_str());
    return s / steps * 1e3;  // ms per step
  };
  const double plain_ms = run(false), fed_ms = run(true);
  std::printf(
      "mock training loop, %.1f ms kernel per %lu MiB batch: copy-then-compute %.2f ms "
      "per step (stall %.2f ms), feeder %.2f ms per step (stall %.2f ms)\n",
      kernel_ms, static_cast<unsigned long>(batch_mib), plain_ms, plain_ms - kernel_ms, fed_ms,
      fed_ms - kernel_ms);
  std::printf("  data stall with the feeder / without = %.2f\n",
              (fed_ms - kernel_ms) / std::max(1e-9, plain_ms - kernel_ms));
  cudaFree(dev);
  return 0;
}
