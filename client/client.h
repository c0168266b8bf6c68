// The mmfeed client: what a trainer process links to receive batches.
//
// Client::Attach connects to the daemon's unix socket, asks for a consumer rank, receives the
// rank's ring as a memfd and maps it. Next() yields batches as zero-copy views into the ring;
// a ClientBatch frees its slot when released or destroyed. Keep the Client alive while
// attached: the daemon takes the connection's end as the trainer's death and hands the
// unreleased batches to the next client attaching for that rank.
// One thread per Client.
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <vector>

#include "shm/ring.h"
#include "base/status.h"

namespace mmfeed {

class Client;

class ClientBatch {
 public:
  ClientBatch() = default;
  ~ClientBatch() { Release(); }
  ClientBatch(ClientBatch&& o) noexcept { *this = std::move(o); }
  ClientBatch& operator=(ClientBatch&& o) noexcept;
  ClientBatch(const ClientBatch&) = delete;
  ClientBatch& operator=(const ClientBatch&) = delete;

  uint64_t seq() const { return view_.seq; }
  uint32_t epoch() const { return view_.epoch; }
  const std::vector<std::string_view>& ids() const { return view_.ids; }
  const std::vector<shm::TensorView>& tensors() const { return view_.tensors; }
  // nullptr if there is no tensor of that name.
  const shm::TensorView* tensor(std::string_view name) const;
  // Frees the slot; the views must not be used afterwards.
  void Release();

 private:
  friend class Client;
  shm::RingReader* ring_ = nullptr;
  int slot_ = -1;
  shm::BatchView view_;
};

class Client {
 public:
  static Result<std::unique_ptr<Client>> Attach(const std::string& socket_path, int rank);
  ~Client();

  // Waits for the next batch. Returns true with *batch set, false at the end of the data.
  // timeout_ms < 0 waits forever; on timeout returns a kTimeout error.
  Result<bool> Next(ClientBatch* batch, int timeout_ms = -1);
  const nlohmann::json& info() const { return info_; }

 private:
  Client() = default;
  int sock_ = -1;
  std::unique_ptr<shm::RingReader> ring_;
  nlohmann::json info_;
};

// One request/response on the control socket (used by mmfeedctl).
Result<nlohmann::json> ControlRequest(const std::string& socket_path, const nlohmann::json& request);

}  // namespace mmfeed
