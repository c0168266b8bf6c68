// Supervisor: trainers attaching (a rank, a resume cursor, the ring a reload replaced),
// resuming and detaching. See daemon/supervisor_internal.h.
#include "daemon/supervisor_internal.h"

namespace mmfeed {

Result<AttachGrant> Supervisor::Attach(int rank, int pid, int pidfd,
                                       const std::optional<StreamCursor>& resume,
                                       const std::optional<JobShape>& job) {
  if (ending_)
    return Status::Unavailable(fmt::format(
        "the job {} is ending ({}): attach again in a moment, as the next job's trainer", job_from_,
        ending_->why));
  if (!pipeline_) {  // consumers: auto, and this is the first trainer
    if (!job)
      return Status::Invalid(fmt::format(
          "this daemon takes the job's shape from its trainers (`consumers: auto` in {}) and "
          "none has declared one yet: start the trainer under torchrun or srun (the client "
          "reads their variables), or declare it (mmfeed-consume --job "
          "NUM_NODES,NODE_RANK,LOCAL_WORLD_SIZE)",
          cfg_.file));
    if (draining_) return Status::Unavailable("mmfeedd is stopping");
    MMFEED_RETURN_IF_ERROR(AdoptJob(*job, pid, resume));
  } else if (job) {
    MMFEED_RETURN_IF_ERROR(CheckJob(*job, pid));
  }
  const std::optional<StreamCursor> at = resume ? std::optional(Served(*resume)) : std::nullopt;
  // A rank a reload removed is still served the batches its ring holds.
  if (rank < 0 || rank >= static_cast<int>(holders_.size()) ||
      (rank >= cfg_.trainers() && sinks_[StreamOf(rank)]->ring().Unfinished(MemberOf(rank)) == 0))
    return Status::Invalid(fmt::format(
        "rank {} out of range: this pipeline has {} consumer rank(s), 0 to {} (`consumers:` in "
        "{} sets how many; each trainer process attaches with its own rank, e.g. $LOCAL_RANK)",
        rank, cfg_.trainers(), cfg_.trainers() - 1, cfg_.file));
  const int stream = StreamOf(rank);
  const uint32_t member = MemberOf(rank);
  if (const Holder h = holders_[rank]; h.pid) {
    pollfd p{h.pidfd, POLLIN, 0};
    // The holder attaching again has drained the ring a reload replaced: it moves on.
    const bool moves_on = h.pid == pid && h.sink != sinks_[stream].get();
    if (!moves_on && (h.pidfd < 0 || poll(&p, 1, 0) == 0))
      return Status::Invalid(fmt::format("rank {} is already attached (pid {})", rank, h.pid));
    if (!moves_on)
      spdlog::info("rank {}: its holder pid {} is dead; pid {} takes over", rank, h.pid, pid);
    server_->Disconnect(h.generation);
    Detach(rank, h.pid, h.generation);
  }
  if (ReadyToSwap()) CompleteReload();
  awaiting_reattach_[rank] = false;
  RingSink* sink = sinks_[stream].get();
  if (std::unique_ptr<RingSink>& old = moved_from_[stream]) {
    // A reload replaced the rank's ring. Its batches the trainer has not finished are served
    // from it first (the trainer then attaches again by itself); unless the trainer asks for
    // earlier ones, which the running pipeline makes again.
    if (at) {
      MMFEED_RETURN_IF_ERROR(CheckResume(rank, old->ring(), *at));
      old->ring().ResumeMember(member, at->seq);
    }
    uint64_t first = old->ring().MinReadySeq(static_cast<int>(member));
    if (old->ring().Unfinished(member) > 0 && (!at || at->seq == first)) {
      sink = old.get();
    } else {
      old->ring().ResumeMember(member, UINT64_MAX);  // none of it is this rank's any more
      // Nor any other replica's, and none of them is still attached to it.
      bool read = old->ring().unreleased() > 0;
      for (int t : GroupOf(stream))
        read = read || (holders_[t].pid && holders_[t].sink == old.get());
      if (!read) old.reset();
    }
  }
  if (at && sink == sinks_[stream].get()) MMFEED_RETURN_IF_ERROR(Resume(rank, *at));
  shm::RingWriter& ring = sink->ring();
  MMFEED_ASSIGN_OR_RETURN(int control, ring.Attach(++last_generation_, member));
  // (Taken now: a reload completed above may have added ranks, moving holders_.)
  Holder& h = holders_[rank];
  h = {pid, pidfd >= 0 ? fcntl(pidfd, F_DUPFD_CLOEXEC, 0) : -1, last_generation_, sink};
  spdlog::info("rank {} attached (pid {}, generation {}{}{})", rank, pid, h.generation,
               cfg_.replicas > 1
                   ? fmt::format(", stream {} as replica {} of {}", stream, member, cfg_.replicas)
                   : "",
               sink == sinks_[stream].get() ? "" : ", to the ring a reload replaced");
  if (rank < static_cast<int>(unseen_since_restart_.size()) && unseen_since_restart_[rank]) {
    unseen_since_restart_[rank] = false;
    if (UnseenRanks().empty()) EveryRankBack();
  }
  return AttachGrant{{ring.data_fd(), control},
                     {{"rank", rank},
                      {"stream", stream},
                      {"replicas", cfg_.replicas},
                      {"generation", h.generation},
                      {"ring_bytes", ring.size()},
                      {"consumers", cfg_.trainers()},
                      {"job", JobJson()},
                      // A token budget's rule has its own key: a client from before it would
                      // compute the positions from the batch index, wrongly, so it sees none.
                      {pipeline_->stream().budgeted() ? "step_position" : "position",
                       pipeline_->stream().PositionJson()},
                      {"pipeline", cfg_.name}}};
}

Status Supervisor::Resume(int rank, const StreamCursor& c) {
  const int stream = StreamOf(rank);
  const uint32_t member = MemberOf(rank);
  shm::RingWriter& ring = sinks_[stream]->ring();
  MMFEED_RETURN_IF_ERROR(CheckResume(rank, ring, c));
  // Served from the ring when it holds the cursor's batch (its replicas may have finished it),
  // else the stream is rewound there; replicas past it do not get the batches made again. A
  // replica's cursor past what the stream has made (a restarted daemon starts a stream where
  // every rank of its group stood) waits for the stream there: its peers need what comes
  // before it, and its floor skips it.
  int finished = ring.ResumeMember(member, c.seq);
  const uint64_t made = pipeline_->NextCommit(stream);
  uint64_t next = ring.MinReadySeq(static_cast<int>(member));
  if (next == UINT64_MAX) next = made;
  const bool waits = cfg_.replicas > 1 && c.seq > made;
  if (next != c.seq && !waits) {
    Status st = pipeline_->Rewind(stream, c.seq);
    if (st.code() == Status::Code::kClosed && ReadyToSwap()) {
      // The pipeline was handing over at the epoch boundary: its successor serves the rank,
      // if the cursor is of its stream (a trainer past the boundary in the old order is
      // refused, never fed the rest of the epoch in the new one).
      CompleteReload();
      st = CheckResume(rank, sinks_[stream]->ring(), c);
      if (st.ok()) st = pipeline_->Rewind(stream, c.seq);
    }
    MMFEED_RETURN_IF_ERROR(st);
  }
  // The acknowledged cursor is where every rank of the group stands: a replica moves it back,
  // never forward.
  if (c.seq >= pipeline_->stream().origin().seq && (cfg_.replicas == 1 || c.seq < ring.acked().seq))
    ring.set_acked(pipeline_->stream().CursorAt(c.seq));
  spdlog::info("rank {}: resuming at batch {} ({} finished batch(es) dropped from the ring, {})",
               rank, c.seq, finished,
               waits           ? "its group's stream is behind it: batches before it skipped"
               : next == c.seq ? "the rest reused"
                               : "the rank rewound");
  return Status::Ok();
}

StreamCursor Supervisor::Served(const StreamCursor& c) const {
  if (!resumed_ || !OfAnotherStreamOfOurOrder(c) || c.epoch != resumed_->epoch ||
      c.position != resumed_->position)
    return c;
  return pipeline_->stream().CursorAt(
      pipeline_->stream().origin().seq);  // stream 0: the origin is every rank's
}

Status Supervisor::CheckResume(int rank, shm::RingWriter& ring, const StreamCursor& c) {
  const uint64_t seq = c.seq;
  // A position of this order must lie in its epoch, whatever stream the cursor names: an
  // edited one is refused, never served as another (its seq is what this stream resumes at).
  if (c.order && c.order == pipeline_->stream().order_tag() && pipeline_->stream().positional()) {
    if (Result<Pipeline::Origin> o =
            pipeline_->stream().Rebased(c.epoch, c.position, c.lanes, c.nodes);
        !o.ok())
      return o.status().WithContext(
          fmt::format("rank {}: resume refused: the cursor (epoch {}, position {})", rank, c.epoch,
                      c.position));
  }
  if (const uint32_t ours = pipeline_->stream().StreamBefore(seq);
      c.stream && ours && c.stream != ours) {
    std::string why =
        "the cursor was saved in another run or with another config or data (restart the "
        "daemon with that run's config and --state-dir, or attach without it to start the "
        "rank over)";
    if (c.order && c.order != pipeline_->stream().order_tag())
      why += "; its order differs too (other data, seed or shuffle)";
    else if (c.order && resumed_)
      why = fmt::format(
          "the cursor is at epoch {}, position {} of the job's order, but this daemon resumed "
          "the job at epoch {}, position {} ({}'s cursor): every rank resumes from the "
          "checkpoint of the same step",
          c.epoch, c.position, resumed_->epoch, resumed_->position, resumed_->from);
    else if (c.order && !pipeline_->stream().positional())
      why += fmt::format("; this pipeline cannot resume a job at a position: {}",
                         *pipeline_->stream().why_not_positional());
    else if (c.order) {
      const Result<Pipeline::Origin> o =
          pipeline_->stream().Rebased(c.epoch, c.position, c.lanes, c.nodes);
      why = !o.ok() ? fmt::format("{}; the job cannot resume at its position: {}", why,
                                  o.status().message())
                    : fmt::format(
                          "the cursor is at epoch {}, position {} of the job's order, taken at "
                          "another shape or in another run: a daemon resumes a job there when it "
                          "takes the job's shape from its trainers (`consumers: auto`), from the "
                          "first trainer's cursor",
                          c.epoch, c.position);
    }
    return Status::Invalid(
        fmt::format("rank {}: resume refused: the cursor (batch {}) is of stream {:08x}, but this "
                    "daemon's batch {} is of stream {:08x}: {}",
                    rank, seq, c.stream, seq - 1, ours, why));
  }
  const uint64_t first = ring.MinPublishedSeq(), next = pipeline_->NextCommit(StreamOf(rank));
  if (seq <= next && (first == UINT64_MAX ? seq == next : first <= seq)) return Status::Ok();
  Status st = pipeline_->stream().CheckCursor(seq);
  return st.ok() ? st : st.WithContext(fmt::format("rank {}: resume refused", rank));
}

void Supervisor::Detach(int rank, int pid, uint32_t generation) {
  Holder& h = holders_[rank];
  if (h.generation != generation || !h.pid) return;  // already taken over
  if (h.pidfd >= 0) ::close(h.pidfd);
  RingSink* sink = h.sink;
  h = Holder{};
  int n = sink->ring().Detach(MemberOf(rank));
  // A reader that scribbled over its control area and then died: its slots are taken back
  // all the same, and the next attach gets a fresh control area.
  if (std::string why = sink->ring().TakeViolation(MemberOf(rank)); !why.empty())
    spdlog::warn(
        "rank {}: pid {} left its control area corrupt ({}); its batches are "
        "delivered again to the next attach",
        rank, pid, why);
  spdlog::info("rank {} detached (pid {}); {} unreleased batch(es) will be delivered again", rank,
               pid, n);
}

}  // namespace mmfeed
