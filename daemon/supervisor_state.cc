// Supervisor: --state-dir, the saved stream (daemon/stream_state.h is its file format): read
// and checked at start, written after every acknowledged cursor. See
// daemon/supervisor_internal.h.
#include "daemon/supervisor_internal.h"

namespace mmfeed {

Result<PipelineConfig> Supervisor::KeptConfig(const StreamState& s, const JobShape* job) const {
  Result<PipelineConfig> cfg = ParseConfig(s.config_text, s.config_file);
  if (!cfg.ok()) return cfg;
  MMFEED_RETURN_IF_ERROR(CheckFaultsAllowed(*cfg, opt_.allow_faults));
  cfg->SetIndexDir(opt_.state_dir);
  if (job && cfg->shape_from_trainers())
    MMFEED_RETURN_IF_ERROR(
        cfg->AdoptShape(job->local_world_size, job->node_rank, job->num_nodes, job->replicas));
  cfg->mix.switches = s.mix_switches;
  ConfigChanges changes = DiffConfigs(*cfg, cfg_);
  if (!changes.needs_restart.empty())
    return Status::Unsupported(
        fmt::format("the edited config changes what a reload cannot: {}", changes.needs_restart));
  // It must still make the saved stream (its data may be gone or changed since).
  Result<std::unique_ptr<Pipeline>> p = Pipeline::Create(*cfg, {});
  if (!p.ok()) return p.status().WithContext("the kept config cannot be built");
  if ((*p)->stream().fingerprint() != s.fingerprint)
    return Status::Invalid("its data changed since the state was saved");
  return cfg;
}

Status Supervisor::LoadState(std::optional<StreamState> saved) {
  if (!saved) {
    spdlog::info("no saved cursors in {}: starting every rank at the beginning", state_.path());
    return Status::Ok();
  }
  if (saved->fingerprint != pipeline_->stream().fingerprint()) {
    spdlog::warn(
        "{} is for another stream (fingerprint {}, this config makes {}: the data or the "
        "config changed): starting fresh",
        state_.path(), saved->fingerprint, pipeline_->stream().fingerprint());
    return Status::Ok();
  }
  const auto bad_base = [&](const std::string& why) {
    return Status::Invalid(fmt::format(
        "{}: the origin's base {} is not a position this pipeline resumes at{} (move the file "
        "away to start every rank at the beginning)",
        state_.path(), saved->origin_base, why));
  };
  if (saved->origin_base) {
    if (!pipeline_->stream().positional())
      return bad_base(": " + *pipeline_->stream().why_not_positional());
    Result<Pipeline::Origin> o = pipeline_->stream().Rebased(
        saved->origin_epoch, saved->origin_base, saved->origin_lanes, saved->origin_nodes);
    if (!o.ok()) return bad_base(": " + o.status().message());
    if (o->base != saved->origin_base) return bad_base("");
  }
  // A reload that changed the order or the numbering started this config's batches there.
  MMFEED_RETURN_IF_ERROR(pipeline_->SetOrigin(
      {saved->origin_epoch, saved->origin_seq,
       saved->origin_stream ? saved->origin_stream : pipeline_->stream().origin().stream,
       saved->origin_previous, saved->origin_base, saved->origin_lanes, saved->origin_nodes}));
  for (size_t r = 0; r < saved->ranks.size(); ++r) {
    StreamCursor& c = saved->ranks[r];
    if (c.seq < saved->origin_seq) {
      // The daemon stopped while this rank's trainer still had batches of the config before
      // that reload to take; this config cannot make them.
      spdlog::warn(
          "rank {}: batches {}-{} of the config before the last reload were not released by "
          "the rank's trainer and cannot be made again: the rank starts at batch {} (epoch "
          "{}); a trainer that finished them goes on there, one that resumes before it is "
          "refused",
          r, c.seq, saved->origin_seq - 1, saved->origin_seq, saved->origin_epoch);
      c = pipeline_->stream().CursorAt(saved->origin_seq);
    }
  }
  Status valid = pipeline_->SetStart(saved->ranks);
  if (!valid.ok())
    return valid.WithContext(fmt::format(
        "{}: the saved cursors do not fit this config (move the file away to start every rank "
        "at the beginning)",
        state_.path()));
  for (int r = 0; r < cfg_.consumers; ++r) sinks_[r]->ring().set_acked(saved->ranks[r]);
  unseen_since_restart_.assign(cfg_.trainers(), true);
  std::string at;
  for (const StreamCursor& c : saved->ranks) at += fmt::format(" {}", c.seq);
  spdlog::info("continuing from the saved cursors in {}: ranks at batch{}", state_.path(), at);
  return Status::Ok();
}

Status Supervisor::SaveState() {
  if (!state_.enabled()) return Status::Ok();
  const Pipeline::Origin origin = pipeline_->stream().origin();
  StreamState state{cfg_.name,
                    pipeline_->stream().fingerprint(),
                    origin.epoch,
                    origin.seq,
                    origin.stream,
                    origin.previous,
                    {},
                    cfg_.file,
                    cfg_.text};
  state.origin_base = origin.base;
  state.origin_lanes = origin.lanes;
  state.origin_nodes = origin.nodes;
  state.mix_switches = pipeline_->MixSwitches();
  for (int r = 0; r < cfg_.consumers; ++r) state.ranks.push_back(AckedOf(r));
  return state_.Write(state);
}

}  // namespace mmfeed
