// Supervisor: the end of a job a `consumers: auto` daemon adopted. When every trainer of it has
// left and none came back within the lease (--job-lease), or at `mmfeedctl end-job`, the job
// ends as a run does (its pipeline stopped, its cursors saved, its profile reported) and the
// daemon waits for the next job's shape. See daemon/supervisor_internal.h.
#include "daemon/supervisor_internal.h"

namespace mmfeed {

void Supervisor::DropJobParts() {
  pipeline_.reset();
  metrics_.reset();
  pipeline_sinks_.clear();
  packers_.clear();
  sinks_.clear();
  moved_from_.clear();
  awaiting_reattach_.clear();
  holders_.clear();
  rates_.clear();
  unseen_since_restart_.clear();
  resumed_.reset();
  tuner_.reset();
  tune_sample_.reset();
  tune_decisions_.clear();
  ring_bytes_ = 0;
  moved_published_ = 0;
  state_.Forget();
  warned_missing_trainers_ = false;
}

int Supervisor::AttachedTrainers() const {
  int n = 0;
  for (const Holder& h : holders_) n += h.pid != 0;
  return n;
}

std::string Supervisor::WhenJobFrees() const {
  if (!job_adopted_) return "";
  if (ending_) return "it is ending now";
  const int attached = AttachedTrainers();
  if (attached > 0)
    return fmt::format(
        "{} of its trainers attached; it frees {:.0f} s after the last one leaves "
        "(mmfeedd --job-lease), or at once with `mmfeedctl end-job` once none is attached",
        attached, opt_.job_lease);
  const double gone =
      trainers_gone_since_
          ? std::chrono::duration<double>(std::chrono::steady_clock::now() - *trainers_gone_since_)
                .count()
          : 0;
  return fmt::format(
      "no trainer of it is attached; it frees in {:.0f} s (mmfeedd --job-lease {:.0f}), or at "
      "once with `mmfeedctl end-job`",
      std::max(0.0, opt_.job_lease - gone), opt_.job_lease);
}

void Supervisor::WatchJobLease() {
  if (!job_adopted_ || draining_ || ending_) return;
  const auto now = std::chrono::steady_clock::now();
  if (AttachedTrainers() > 0) {
    trainers_gone_since_.reset();
    return;
  }
  if (!trainers_gone_since_) trainers_gone_since_ = now;
  // A reload under way holds the pipeline: the job ends after it.
  if (reload_thread_.joinable() || pending_) return;
  if (now - *trainers_gone_since_ >= std::chrono::duration<double>(opt_.job_lease))
    (void)BeginEndJob(fmt::format("no trainer attached for {:.0f} s (--job-lease)", opt_.job_lease),
                      nullptr);
}

Status Supervisor::BeginEndJob(const std::string& why, JobEnded done) {
  if (!job_adopted_ || !pipeline_)
    return Status::Invalid(
        pipeline_ ? fmt::format("this daemon serves the shape its config sets ({}), not a job "
                                "adopted from its trainers: there is no job to end (stop it "
                                "instead)",
                                cfg_.file)
                  : "no job to end: the daemon waits for the first trainer to declare one");
  if (draining_) return Status::Unavailable("mmfeedd is stopping");
  if (const int attached = AttachedTrainers(); attached > 0) {
    std::string pids;
    for (const Holder& h : holders_)
      if (h.pid) pids += fmt::format("{}{}", pids.empty() ? "" : ", ", h.pid);
    return Status::Invalid(fmt::format(
        "{} trainer(s) of the job are attached (pid {}): stop them first; the job ends when "
        "none is attached",
        attached, pids));
  }
  if (reload_thread_.joinable() || pending_)
    return Status::Unavailable("a reload is under way: end the job once it is done");
  if (!ending_) {
    spdlog::info("the job {} ends: {}; its pipeline stops, its cursors are kept", job_from_, why);
    ending_ = Ending{why, {}};
    for (const auto& w : windows_) w->cancel();  // their requests get an error
    for (auto& s : sinks_) s->Abort();  // batches no trainer took are made again from the cursors
    pipeline_->RequestStop();
  }
  if (done) ending_->done.push_back(std::move(done));
  return Status::Ok();
}

void Supervisor::CompleteEndJob() {
  pipeline_->Wait();
  (void)SaveState();  // logged
  totals_.Retire(pipeline_->Profile());
  (void)Report();  // the job's profile, as at a daemon's end
  const nlohmann::json ended = {{"job", job_ ? job_->Describe() : ""},
                                {"from", job_from_},
                                {"why", ending_->why},
                                {"cursors", state_.enabled() ? state_.path() : ""}};
  std::vector<JobEnded> done = std::move(ending_->done);
  DropJobParts();  // everything the job made goes; the daemon counters (Retire) stay
  job_.reset();
  job_from_.clear();
  job_warned_.clear();
  job_adopted_ = false;
  trainers_gone_since_.reset();
  ending_.reset();
  cfg_.ForgetShape();
  // The next job continues the saved stream when it is the same job (a restart would too).
  saved_.reset();
  kept_waits_for_job_ = false;
  if (state_.enabled()) {
    Result<std::optional<StreamState>> read = SavedStream();
    if (read.ok()) {
      saved_ = std::move(read.value());
      KeepSavedConfig(nullptr);
    } else {
      spdlog::warn("{}: the next job starts fresh", read.status().message());
    }
  }
  spdlog::info("the job ended ({}); waiting for the next trainer to declare a job's shape",
               ended["why"].get<std::string>());
  notify_.Ready("waiting for the next trainer to declare the job's shape");
  for (auto& d : done) d(ended);
}

void Supervisor::EndJob(JobEnded done) {
  Status st = BeginEndJob("mmfeedctl end-job", done);
  if (!st.ok()) done(st);
}

}  // namespace mmfeed
