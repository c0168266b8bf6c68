// Token-budget batches: Pipeline::MeasureCatalog, every catalog entry's cost, measured by the
// stages or read from the cost index an earlier start kept.
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <set>
#include <thread>
#include <unordered_map>

#include "base/rng.h"
#include "engine/mailbox.h"
#include "engine/numa.h"
#include "engine/pipeline.h"
#include "engine/pipeline_internal.h"
#include "engine/trace.h"
#include "source/catalog.h"

namespace mmfeed {

// Measures every entry's cost with the `measured` branches' stages (Measure: headers, tokens),
// on as many threads as those stages have workers; failures are kept, sorted by entry.
Status Pipeline::MeasureEntries(const std::vector<bool>& measured, MeasuredCatalog* m) {
  const size_t n = catalog_->size();
  m->costs.assign(n, {});
  std::mutex failures_mu;
  std::atomic<size_t> next{0};
  auto measure = [&] {
    std::vector<std::unique_ptr<StageWorker>> workers(branches_.size());
    std::vector<std::vector<uint8_t>> rows(plan_.specs.size());  // one sample's outputs
    std::vector<uint8_t*> out(plan_.specs.size());
    for (size_t b = 0; b < branches_.size(); ++b) {
      if (!measured[b]) continue;
      workers[b] = branches_[b]->cfg->stage->NewWorker();
      for (size_t t = plan_.first_tensor[b]; t < plan_.first_tensor[b] + branches_[b]->specs.size();
           ++t) {
        const bool patches =
            std::find(patch_tensors_.begin(), patch_tensors_.end(), t) != patch_tensors_.end();
        if (!patches) rows[t].resize(plan_.specs[t].NumBytes());
        out[t] = patches ? nullptr : rows[t].data();
      }
    }
    CatalogEntry read;
    std::vector<const FieldValue*> fields;
    std::vector<const uint8_t*> tensors;
    std::vector<const TensorSpec*> tensor_specs;
    for (size_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < n;) {
      const CatalogEntry* e = &read;
      Status st;
      if (catalog_->indexed())
        st = catalog_->Read(i, &read);
      else
        e = &catalog_->entries[i];
      std::string stage = "source";
      // The stages others read first, then those that read them.
      for (int pass = 0; pass < 2 && st.ok(); ++pass) {
        for (size_t b = 0; b < branches_.size() && st.ok(); ++b) {
          const Branch& br = *branches_[b];
          if (!measured[b] || br.reads_others != (pass == 1)) continue;
          stage = br.cfg->name;
          fields.clear();  // as WorkerLoop: a mixture's sample may lack fields
          for (const std::string& f : br.read_fields)
            fields.push_back(FieldOrAbsent(*catalog_, *e, f));
          tensors.clear();
          tensor_specs.clear();
          for (size_t t : br.read_tensors) {
            tensors.push_back(out[t]);
            tensor_specs.push_back(&plan_.specs[t]);
          }
          const FieldValue* field = FieldOrAbsent(*catalog_, *e, br.cfg->field);
          if (!field || std::find(fields.begin(), fields.end(), nullptr) != fields.end()) {
            st = Status::NotFound("sample lacks a field a stage needs");
            break;
          }
          if (field == &kAbsentField && plan_.present[b] >= 0) {  // zero rows: nothing to count
            for (size_t k = 0; k < br.specs.size(); ++k)
              if (out[plan_.first_tensor[b] + k])
                std::memset(out[plan_.first_tensor[b] + k], 0, br.specs[k].NumBytes());
            continue;
          }
          SampleContext ctx{cfg_.source.seed, 0, e->id, e->origin};
          ctx.fields = fields.data();
          ctx.tensors = tensors.data();
          ctx.tensor_specs = tensor_specs.data();
          ScopedFilePolicy files(&br.files);
          ScopedSampleDeadline deadline(cfg_.sample_timeout_s);
          st = Guarded(br.cfg->type, [&] {
            return workers[b]->Measure(
                ctx, *field, OutputRow(out.data() + plan_.first_tensor[b], br.specs.size()));
          });
        }
      }
      if (st.ok()) {
        m->costs[i] = CostOf([&](size_t t) { return out[t]; });
        continue;
      }
      m->costs[i].tokens = SampleCost::kUnusable;
      if (st.code() == Status::Code::kResourceExhausted) {
        Fail(st.WithContext("measuring samples: out of resources, not a bad sample"));
        next.store(n);
      }
      std::lock_guard<std::mutex> lock(failures_mu);
      m->failures.push_back({static_cast<uint32_t>(i), stage, st});
    }
  };
  int threads = 0;
  for (size_t b = 0; b < branches_.size(); ++b) threads += measured[b] ? branches_[b]->threads : 0;
  threads = std::clamp<int>(threads, 1, static_cast<int>(std::max<size_t>(n / 64, 1)));
  spdlog::info("token budget: measuring {} samples on {} thread(s)", n, threads);
  std::atomic<int> running{threads};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&] {
      measure();
      running.fetch_sub(1, std::memory_order_release);
    });
  // Progress every 10 s: a large catalog takes minutes the first time.
  for (uint64_t last = NowNs(); running.load(std::memory_order_acquire) > 0;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (NowNs() - last < 10'000'000'000ull) continue;
    last = NowNs();
    spdlog::info("token budget: {} of {} samples measured", std::min(next.load(), n), n);
  }
  for (std::thread& t : pool) t.join();
  MMFEED_RETURN_IF_ERROR(status());
  std::sort(m->failures.begin(), m->failures.end(),
            [](const auto& a, const auto& b) { return a.entry < b.entry; });
  return Status::Ok();
}

// Token-budget batches: every catalog entry's cost, measured by the stages (an image's header,
// a video's stream, a text's tokens) on as many threads as the measured stages have workers, or
// read from the cost index an earlier start kept (indexed sources). Costs are measured for the
// whole catalog, not only this node's share: every node plans every rank.
Result<std::vector<SampleCost>> Pipeline::MeasureCatalog() {
  const uint64_t t0 = NowNs();
  const size_t n = catalog_->size();
  // The tensors holding tokens, and the patch tensors (null rows when measuring). The stages
  // measured: those a budget counts, and the ones they read (an image stage beside a budgeted
  // text stage is not). What they are, with the source's stamp, keys the cost index.
  std::vector<bool> measured(branches_.size());
  for (size_t b = 0; b < branches_.size(); ++b) {
    const Stage::CostOutputs c = branches_[b]->cfg->stage->Costs();
    for (size_t k = 0; k < branches_[b]->specs.size(); ++k) {
      if (branches_[b]->specs[k].name == c.tokens)
        token_tensors_.push_back(plan_.first_tensor[b] + k);
      if (branches_[b]->specs[k].name == c.patches)
        patch_tensors_.push_back(plan_.first_tensor[b] + k);
    }
    if (c.tokens.empty() && c.patches.empty()) continue;
    measured[b] = true;
    for (size_t o : branches_[b]->read_branches) measured[o] = true;
  }
  uint64_t key = HashString(fmt::format("costs 1|{}|{:016x}|{}", n,
                                        catalog_->indexed() ? catalog_->index_fingerprint() : 0,
                                        cfg_.source.max_bytes));
  for (const std::string& root : branches_[0]->files.roots) key = HashString(root, key);
  for (size_t b = 0; b < branches_.size(); ++b) {
    const StageConfig& s = *branches_[b]->cfg;
    if (measured[b])
      key = HashString(fmt::format("{}|{}|{}|{}", s.name, s.type, s.field, s.params.Canonical()),
                       key);
  }

  MeasuredCatalog m;
  std::string path, how = "measured";
  bool have = false;
  if (catalog_->indexed()) {
    path = CostIndexPath(cfg_.source.path, cfg_.source.index_dir);
    Result<MeasuredCatalog> read = ReadCostIndex(path, key, n);
    if (read.ok()) {
      m = std::move(read.value());
      have = true;
      how = "read from " + path;
    } else if (read.status().code() != Status::Code::kNotFound) {
      spdlog::info("token budget: measuring again ({})", read.status().message());
    }
  }
  if (!have) {
    MMFEED_RETURN_IF_ERROR(MeasureEntries(measured, &m));
    if (!path.empty() && !WriteCostIndex(path, key, m))
      spdlog::warn("token budget: cannot keep the costs in {} ({}): the next start measures again",
                   path, std::strerror(errno));
  }

  // A sample over a budget on its own can never be batched.
  std::vector<SampleCost> costs = std::move(m.costs);
  std::vector<MeasuredCatalog::Failure> failures = std::move(m.failures);
  const size_t unreadable = failures.size();
  const BatchBudget budget = BudgetOf(cfg_);
  for (size_t i = 0; i < n; ++i) {
    if (!costs[i].usable()) continue;
    const std::string refused = budget.Refuses(costs[i]);
    if (refused.empty()) continue;
    costs[i].tokens = SampleCost::kUnusable;
    failures.push_back({static_cast<uint32_t>(i), cfg_.stages[cfg_.batch_stage].name,
                        Status::TooLarge("the sample alone has " + refused)});
  }
  std::inplace_merge(failures.begin(), failures.begin() + unreadable, failures.end(),
                     [](const auto& a, const auto& b) { return a.entry < b.entry; });
  for (const MeasuredCatalog::Failure& f : failures) {
    CatalogEntry e;
    if (catalog_->indexed()) {
      Status read = catalog_->Read(f.entry, &e);  // even unparsed, it has its id and origin
      (void)read;
    } else {
      e = catalog_->entries[f.entry];
    }
    SampleFailed(e, f.stage, f.status);
    MMFEED_RETURN_IF_ERROR(status());  // on_error: fail
    failed_.fetch_add(1, std::memory_order_relaxed);
  }
  spdlog::info("token budget: {} samples {} in {:.3f}s, {} unusable", n, how, (NowNs() - t0) / 1e9,
               failures.size());
  return costs;
}

}  // namespace mmfeed
