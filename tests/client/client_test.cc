// The client against the real mmfeedd binary: leases, fork safety, timeouts.
#include "client/client.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <thread>

#include "tests/test_util.h"

#ifdef MMFEED_HAVE_CUDA
#include "client/cuda_feeder.h"
#ifdef MMFEED_HAVE_CUDA_KERNELS
#include "client/cuda_normalize.h"
#endif
#endif

namespace mmfeed {
namespace {

// A real mmfeedd serving `n` text samples to one rank, with `slots` ring slots.
class RealDaemon {
 public:
  RealDaemon(int n, int slots, int epochs = 1) {
    std::ofstream m(dir_ / "manifest.jsonl");
    for (int i = 0; i < n; ++i)
      m << "{\"id\": \"s" << i << "\", \"text\": \"caption " << i << "\"}\n";
    m.close();
    testing::WriteFile(
        dir_ / "p.yaml",
        "source: {type: manifest, path: manifest.jsonl, epochs: " + std::to_string(epochs) +
            "}\n"
            "stages:\n"
            "  - {name: text, type: text, field: text, params: {max_len: 16}}\n"
            "  - {name: batch, type: batch, inputs: [text], params: {batch_size: 4}}\n"
            "output: {ring_slots: " +
            std::to_string(slots) + "}\n");
    socket_ = dir_ / "mmfeed.sock";
    pid_ = fork();
    if (pid_ == 0) {
      std::string bin = std::string(MMFEED_BIN_DIR) + "/mmfeedd", cfg = dir_ / "p.yaml";
      execl(bin.c_str(), bin.c_str(), "--config", cfg.c_str(), "--socket", socket_.c_str(),
            "--log-level", "warn", nullptr);
      _exit(127);
    }
    for (int i = 0; i < 1000 && !Serving(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ~RealDaemon() {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  const std::string& socket() const { return socket_; }

 private:
  bool Serving() const {
    int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strcpy(a.sun_path, socket_.c_str());
    bool ok = connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
    close(fd);
    return ok;
  }
  testing::TempDir dir_;
  std::string socket_;
  pid_t pid_ = -1;
};

TEST(ClientTest, ABatchOutlivesTheClientAndStaysHeldUntilItsLastHolderGoes) {
  RealDaemon d(40, 2);
  auto c = Client::Attach(d.socket(), 0);
  ASSERT_TRUE(c.ok()) << c.status().message();
  auto b = (*c)->Next(5000);
  ASSERT_TRUE(b.ok() && *b) << b.status().message();
  std::shared_ptr<Batch> batch = *b;
  std::shared_ptr<Batch> copy = batch;  // e.g. a tensor made from it
  EXPECT_EQ(batch->seq(), 0u);
  EXPECT_EQ(batch->cursor().seq, 1u);
  const shm::TensorView* text = batch->tensor("text");
  ASSERT_NE(text, nullptr);
  c->reset();  // the client goes first
  batch.reset();
  // Still mapped and still ours: the data reads back (ASan would catch an unmapped read).
  const int32_t* tokens = reinterpret_cast<const int32_t*>(copy->tensor("text")->data);
  EXPECT_EQ(tokens[0], 'c');
  copy.reset();
}

TEST(ClientTest, NoImplicitReleaseAndNextWaitsTheWholeTimeout) {
  RealDaemon d(40, 2);  // two slots: while we hold two batches nothing else can be published
  auto c = Client::Attach(d.socket(), 0);
  ASSERT_TRUE(c.ok()) << c.status().message();
  auto first = (*c)->Next(5000);
  ASSERT_TRUE(first.ok() && *first);
  auto other = (*c)->Next(5000);
  ASSERT_TRUE(other.ok() && *other);
  auto t0 = std::chrono::steady_clock::now();
  auto second = (*c)->Next(400);
  double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), Status::Code::kTimeout);
  EXPECT_GE(waited, 0.39) << "Next(400) must wait the whole timeout";
  EXPECT_EQ((*first)->seq(), 0u) << "the first batch is still held, not released by Next";
  first->reset();
  auto third = (*c)->Next(5000);
  ASSERT_TRUE(third.ok() && *third);
  EXPECT_EQ((*third)->seq(), 2u);
}

TEST(ClientTest, AForkedChildCannotUseTheClientNorReleaseTheParentsBatch) {
  RealDaemon d(40, 2);
  auto c = Client::Attach(d.socket(), 0);
  ASSERT_TRUE(c.ok()) << c.status().message();
  auto held = (*c)->Next(5000);
  ASSERT_TRUE(held.ok() && *held);
  auto also_held = (*c)->Next(5000);
  ASSERT_TRUE(also_held.ok() && *also_held);
  pid_t child = fork();
  if (child == 0) {
    auto r = (*c)->Next(100);
    bool refused = !r.ok() && r.status().message().find("forked process") != std::string::npos;
    held->reset();  // the child's copy of the lease: must not free the parent's slot
    _exit(refused ? 0 : 1);
  }
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the child must get a clear error";
  // The parent still holds both slots: nothing new can arrive.
  auto none = (*c)->Next(300);
  EXPECT_FALSE(none.ok());
  EXPECT_EQ((*held)->seq(), 0u);
  held->reset();
  auto next = (*c)->Next(5000);
  ASSERT_TRUE(next.ok() && *next);
  EXPECT_EQ((*next)->seq(), 2u);
}

TEST(ClientTest, TheEndOfTheDataIsANullBatch) {
  RealDaemon d(8, 2);
  auto c = Client::Attach(d.socket(), 0);
  ASSERT_TRUE(c.ok()) << c.status().message();
  int batches = 0;
  while (true) {
    auto b = (*c)->Next(5000);
    ASSERT_TRUE(b.ok()) << b.status().message();
    if (!*b) break;
    ++batches;
  }
  EXPECT_EQ(batches, 2);
}

#ifdef MMFEED_HAVE_CUDA
// The CUDA feeder. Without a GPU (as in CI) the cases that copy skip with the reason; the
// error a trainer gets, and its CPU path, are tested everywhere.
// The job a trainer declares (issue #31): read from torchrun's or Slurm's variables, sent with
// the attach and checked by the daemon's parser.
class JobShapeTest : public ::testing::Test {
 protected:
  void SetUp() override { Clear(); }
  void TearDown() override { Clear(); }
  static void Clear() {
    for (const char* v : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                          "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NODEID",
                          "SLURM_NNODES", "SLURM_NTASKS_PER_NODE", "MMFEED_REPLICAS"})
      unsetenv(v);
  }
  static void Set(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (auto [k, v] : vars) setenv(k, v, 1);
  }
};

TEST_F(JobShapeTest, TorchrunsAndSlurmsVariablesGiveTheShape) {
  Result<std::optional<JobShape>> none = JobShapeFromEnvironment();
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(*none);
  Set({{"LOCAL_RANK", "1"}});  // set by hand: a rank, not a job
  ASSERT_TRUE(JobShapeFromEnvironment().ok());
  EXPECT_FALSE(*JobShapeFromEnvironment());
  Set({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_WORLD_SIZE", "4"}, {"GROUP_RANK", "1"}});
  Result<std::optional<JobShape>> t = JobShapeFromEnvironment();
  ASSERT_TRUE(t.ok()) << t.status().message();
  ASSERT_TRUE(*t);
  EXPECT_EQ((*t)->from, "torchrun");
  EXPECT_EQ((*t)->local_rank, 1);
  EXPECT_EQ((*t)->num_nodes, 2);
  EXPECT_EQ((*t)->node_rank, 1);
  EXPECT_EQ((*t)->Describe(), "2 node(s) x 4 rank(s), this node 1");
  EXPECT_EQ((*t)->replicas, 0) << "no group size declared";
  Set({{"MMFEED_REPLICAS", "2"}});  // the model-parallel group size, which no launcher says
  Result<std::optional<JobShape>> groups = JobShapeFromEnvironment();
  ASSERT_TRUE(groups.ok()) << groups.status().message();
  EXPECT_EQ((*groups)->replicas, 2);
  EXPECT_EQ((*groups)->Describe(), "2 node(s) x 4 rank(s), this node 1, in groups of 2 (replicas)");
  for (const char* bad : {"3", "0", "two"}) {
    Set({{"MMFEED_REPLICAS", bad}});
    EXPECT_FALSE(JobShapeFromEnvironment().ok()) << bad << " (4 ranks a node)";
  }
  Clear();
  Set({{"SLURM_PROCID", "7"},
       {"SLURM_NTASKS", "9"},
       {"SLURM_LOCALID", "1"},
       {"SLURM_NODEID", "2"},
       {"SLURM_NNODES", "3"}});
  Result<std::optional<JobShape>> s = JobShapeFromEnvironment();
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ((*s)->from, "slurm");
  EXPECT_EQ((*s)->local_world_size, 3);
  EXPECT_EQ((*s)->node_rank, 2);
  Set({{"SLURM_NTASKS", "8"}});
  EXPECT_NE(JobShapeFromEnvironment().status().message().find(
                "$SLURM_NTASKS 8 is not a multiple of $SLURM_NNODES 3"),
            std::string::npos);
  Clear();
  // Another launcher's (RANK, WORLD_SIZE, LOCAL_RANK without the rest): not torchrun's job.
  Set({{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}});
  ASSERT_TRUE(JobShapeFromEnvironment().ok());
  EXPECT_FALSE(*JobShapeFromEnvironment());
}

// $MMFEED_REPLICAS is never dropped: a job declared without a group size takes it, and an
// attach with no job to carry it is refused (before it connects).
TEST_F(JobShapeTest, ADeclaredGroupSizeIsNeverDropped) {
  Set({{"MMFEED_REPLICAS", "2"}});
  const std::string nowhere = "/nonexistent/mmfeed.sock";
  Result<std::unique_ptr<Client>> alone = Client::Attach(nowhere, 0);
  ASSERT_FALSE(alone.ok());
  EXPECT_NE(alone.status().message().find("$MMFEED_REPLICAS is 2 but this attach declares no job"),
            std::string::npos)
      << alone.status().message();
  AttachOptions three;
  three.job = JobShape{0, 3, 0, 3, 0, 1, 0, "arguments"};
  Result<std::unique_ptr<Client>> odd = Client::Attach(nowhere, 0, three);
  ASSERT_FALSE(odd.ok());
  EXPECT_NE(odd.status().message().find("replicas 2 does not divide local_world_size 3"),
            std::string::npos)
      << odd.status().message();
  AttachOptions four;
  four.job = JobShape{0, 4, 0, 4, 0, 1, 0, "arguments"};
  Result<std::unique_ptr<Client>> fine = Client::Attach(nowhere, 0, four);
  ASSERT_FALSE(fine.ok());
  EXPECT_NE(fine.status().message().find("cannot connect"), std::string::npos)
      << "the job with its group size is sent: " << fine.status().message();
}

TEST_F(JobShapeTest, AnAttachCarriesAShapeTheParserChecks) {
  auto parse = [](const std::string& job) {
    return ParseControlRequest(R"({"cmd":"attach","rank":1,"job":)" + job + "}");
  };
  Result<ControlCommand> ok = parse(
      R"({"rank":3,"world_size":4,"local_rank":1,"local_world_size":2,"node_rank":1,"num_nodes":2,"from":"torchrun"})");
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  ASSERT_TRUE(ok->job);
  EXPECT_EQ(ok->job->num_nodes, 2);
  EXPECT_EQ(ok->job->from, "torchrun");
  EXPECT_EQ(ok->job->replicas, 0);
  Result<ControlCommand> groups = parse(
      R"({"rank":3,"world_size":4,"local_rank":1,"local_world_size":2,"node_rank":1,"num_nodes":2,"replicas":2})");
  ASSERT_TRUE(groups.ok()) << groups.status().message();
  EXPECT_EQ(groups->job->replicas, 2);
  EXPECT_EQ(JobShape::FromJson(groups->job->ToJson())->replicas, 2) << "round trip";
  EXPECT_FALSE(ParseControlRequest(R"({"cmd":"attach","rank":1})")->job);
  // Out of range, inconsistent, another rank than the attach's, missing, not an object.
  for (
      const char* bad :
      {R"({"rank":3,"world_size":4,"local_rank":1,"local_world_size":2,"node_rank":2,"num_nodes":2})",
       R"({"rank":3,"world_size":5,"local_rank":1,"local_world_size":2,"node_rank":1,"num_nodes":2})",
       R"({"rank":2,"world_size":4,"local_rank":0,"local_world_size":2,"node_rank":1,"num_nodes":2})",
       R"({"rank":3,"world_size":4,"local_rank":1,"local_world_size":2,"node_rank":1})",
       R"({"rank":-1,"world_size":4,"local_rank":1,"local_world_size":2,"node_rank":1,"num_nodes":2})",
       R"({"rank":3,"world_size":4,"local_rank":1,"local_world_size":2,"node_rank":1,"num_nodes":2,"replicas":3})",
       R"({"rank":3,"world_size":4,"local_rank":1,"local_world_size":2,"node_rank":1,"num_nodes":2,"replicas":0})",
       R"([1, 2])"})
    EXPECT_FALSE(parse(bad).ok()) << bad;
}

TEST(ControlRequestTest, AReloadMaySayAtWhichBoundary) {
  EXPECT_FALSE(ParseControlRequest(R"({"cmd":"reload"})")->at_batch);
  EXPECT_TRUE(ParseControlRequest(R"({"cmd":"reload","at":"batch"})")->at_batch);
  EXPECT_FALSE(ParseControlRequest(R"({"cmd":"reload","at":"epoch"})")->at_batch);
  for (const char* bad : {R"({"cmd":"reload","at":"now"})", R"({"cmd":"reload","at":1})"}) {
    Result<ControlCommand> r = ParseControlRequest(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().message(), "reload's \"at\" must be \"batch\" or \"epoch\"");
  }
}

TEST(CursorTest, TheJobsPositionRoundTripsAndComesWholeOrNotAtAll) {
  StreamCursor c{2, 5, 31, 0xabcd};
  c.order = 77;
  c.position = 1u << 20;
  nlohmann::json j = CursorToJson(c);
  EXPECT_EQ(j["order"], 77);
  EXPECT_EQ(j["position"], 1u << 20);
  Result<StreamCursor> back = CursorFromJson(j);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->order, 77u);
  EXPECT_EQ(back->position, 1u << 20);
  EXPECT_EQ(back->lanes, 0u);
  EXPECT_FALSE(j.contains("lanes")) << "an order independent of the shape";
  EXPECT_EQ(*back, c);
  c.lanes = 6;  // a mixture's: the shape that numbered the position
  back = CursorFromJson(CursorToJson(c));
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->lanes, 6u);
  // The position is derived, not the cursor's identity; without an order it is not written.
  StreamCursor plain{2, 5, 31, 0xabcd};
  EXPECT_EQ(plain, c);
  EXPECT_FALSE(CursorToJson(plain).contains("position"));
  for (const char* bad :
       {R"({"seq": 1, "stream": 9, "order": 5})", R"({"seq": 1, "stream": 9, "position": 5})",
        R"({"seq": 1, "stream": 9, "order": 0, "position": 5})",
        R"({"seq": 1, "stream": 9, "order": 4294967296, "position": 5})",
        R"({"seq": 1, "stream": 9, "order": 5, "position": -1})",
        R"({"seq": 1, "epoch": 4294967296})", R"({"seq": 1, "epoch": -1})",
        R"({"seq": 1, "batch": "3"})",
        R"({"seq": 1, "stream": 9, "order": 5, "position": 5, "lanes": 0})",
        R"({"seq": 1, "stream": 9, "order": 5, "position": 5, "lanes": 4294967296})"})
    EXPECT_FALSE(CursorFromJson(nlohmann::json::parse(bad)).ok()) << bad;
  EXPECT_TRUE(
      CursorFromJson(nlohmann::json::parse(R"({"seq": 1, "stream": 9, "order": 5, "position": 5})"))
          .ok());
  // A position without the stream it is of could be read as this stream's own seq: refused.
  for (const char* edited : {R"({"seq": 1, "order": 5, "position": 5})",
                             R"({"seq": 1, "stream": 0, "order": 5, "position": 5})"}) {
    Result<StreamCursor> r = CursorFromJson(nlohmann::json::parse(edited));
    ASSERT_FALSE(r.ok()) << edited;
    EXPECT_NE(r.status().message().find("names its \"stream\" too"), std::string::npos);
  }
}

TEST(CudaFeederTest, WithoutAGpuTheErrorNamesTheCauseAndTheCpuPathGoesOn) {
  RealDaemon d(16, 2);
  auto c = Client::Attach(d.socket(), 0);
  ASSERT_TRUE(c.ok()) << c.status().message();
  Status available = CudaAvailable();
  auto feeder = CudaFeeder::Create(c->get(), {});
  if (available.ok()) {
    EXPECT_TRUE(feeder.ok()) << feeder.status().message();
    EXPECT_FALSE(CudaFeeder::Create(c->get(), {.device = 1 << 20}).ok());
    GTEST_SKIP() << "a CUDA device is present: the no-GPU error cannot be seen here";
  }
  ASSERT_FALSE(feeder.ok());
  const std::string& why = feeder.status().message();
  EXPECT_TRUE(why.find("no CUDA device") != std::string::npos ||
              why.find("driver") != std::string::npos)
      << why;
  EXPECT_NE(why.find("cudaGetDeviceCount"), std::string::npos) << why;
  auto b = (*c)->Next(5000);  // the client is untouched
  ASSERT_TRUE(b.ok() && *b) << b.status().message();
  EXPECT_EQ((*b)->ids().size(), 4u);
}

TEST(CudaFeederTest, EveryBatchArrivesOnTheDeviceByteForByteAndSlotsAreReleased) {
  Status available = CudaAvailable();
  if (!available.ok()) GTEST_SKIP() << "no GPU: " << available.message();
  RealDaemon d(64, 2);  // two slots: the feeder must release them for the stream to go on
  auto c = Client::Attach(d.socket(), 0);
  ASSERT_TRUE(c.ok()) << c.status().message();
  auto feeder = CudaFeeder::Create(c->get(), {});
  ASSERT_TRUE(feeder.ok()) << feeder.status().message();
  int batches = 0;
  for (;;) {
    auto got = (*feeder)->Next(10000);
    ASSERT_TRUE(got.ok()) << got.status().message();
    if (!*got) break;
    const DeviceBatch& b = **got;
    ASSERT_EQ(b.ids.size(), 4u);
    EXPECT_EQ(b.seq, static_cast<uint64_t>(batches));
    const DeviceTensor* text = b.tensor("text");
    ASSERT_TRUE(text);
    std::vector<int32_t> host(text->nbytes / 4);
    ASSERT_EQ(cudaMemcpy(host.data(), text->data, text->nbytes, cudaMemcpyDeviceToHost),
              cudaSuccess);
    for (size_t r = 0; r < b.ids.size(); ++r) {  // row r holds "caption <id>" as byte tokens
      std::string want = "caption " + b.ids[r].substr(1), got_text;
      for (size_t k = 0; k < want.size(); ++k) got_text += static_cast<char>(host[r * 16 + k]);
      EXPECT_EQ(got_text, want);
    }
    ++batches;
  }
  EXPECT_EQ(batches, 16);
  EXPECT_EQ((*feeder)->stats().batches, 16u);
  EXPECT_EQ((*feeder)->stats().registered_mappings, 1) << (*feeder)->stats().registration_error;
}

#ifdef MMFEED_HAVE_CUDA_KERNELS
TEST(CudaFeederTest, TheNormalizeKernelMatchesTheImageStagesFormula) {
  Status available = CudaAvailable();
  if (!available.ok()) GTEST_SKIP() << "no GPU: " << available.message();
  const int n = 2, h = 5, w = 7;
  std::vector<uint8_t> in(n * h * w * 3);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<uint8_t>(i * 37 % 256);
  const float mean[3] = {0.485f, 0.456f, 0.406f}, stdv[3] = {0.229f, 0.224f, 0.225f};
  uint8_t* din;
  float* dout;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&din), in.size()), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dout), in.size() * 4), cudaSuccess);
  cudaMemcpy(din, in.data(), in.size(), cudaMemcpyHostToDevice);
  ASSERT_EQ(NormalizeU8HwcToF32Chw(din, dout, n, h, w, mean, stdv, nullptr), cudaSuccess);
  std::vector<float> out(in.size());
  cudaMemcpy(out.data(), dout, out.size() * 4, cudaMemcpyDeviceToHost);
  for (int i = 0; i < n; ++i)
    for (int c = 0; c < 3; ++c)
      for (int p = 0; p < h * w; ++p) {
        float want = (in[(i * h * w + p) * 3 + c] / 255.0f - mean[c]) / stdv[c];
        EXPECT_NEAR(out[(i * 3 + c) * h * w + p], want, 1e-5);
      }
  cudaFree(din);
  cudaFree(dout);
}
#endif
#endif

}  // namespace
}  // namespace mmfeed
