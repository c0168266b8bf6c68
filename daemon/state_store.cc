#include "daemon/state_store.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace mmfeed {

Result<std::optional<StreamState>> StateStore::Read() {
  if (!enabled()) return std::optional<StreamState>();
  if (!fd_.valid()) {  // opened once: the cursors are written through it
    Result<DirFd> dir = DirFd::Open(dir_, "--state-dir", /*create=*/true);
    if (!dir.ok()) return dir.status();
    fd_ = std::move(dir.value());
  }
  return ReadStreamState(path());
}

Status StateStore::Write(const StreamState& state) {
  if (!enabled()) return Status::Ok();
  std::string text = StreamStateToJson(state).dump() + "\n";
  if (text == written_) return Status::Ok();
  Status st = fd_.valid() ? fd_.WriteAtomically("cursors.json", text)
                          : Status::Invalid(fmt::format("{}: not opened", dir_));
  if (!st.ok() && fd_.valid() && fd_.Gone()) {  // deleted: made again where it was
    Status again = fd_.Refresh(/*create=*/true);
    st = again.ok() ? fd_.WriteAtomically("cursors.json", text) : again;
  }
  const auto now = std::chrono::steady_clock::now();
  if (st.ok()) {
    if (failures_) spdlog::info("{} written again after {} failed attempt(s)", path(), failures_);
    failures_ = 0;
    written_ = std::move(text);
  } else if (failures_++ == 0 || now - warned_at_ >= std::chrono::minutes(1)) {
    spdlog::error("{} (the cursors a restart would continue from are {}; {} attempt(s) failed)",
                  st.message(), failures_ > 1 ? "stale" : "not saved", failures_);
    warned_at_ = now;
  }
  return st;
}

}  // namespace mmfeed
