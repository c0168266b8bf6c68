#include "source/parquet/dataset.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <future>

#include "base/rng.h"
#include "source/index_file.h"
#include "source/parquet/column.h"

namespace mmfeed::parquet {

using json = nlohmann::ordered_json;

// A row group in the cache: decoded by the first reader of one of its rows, waited for by the
// others.
struct Dataset::Slot {
  std::promise<std::shared_ptr<const Group>> promise;
  std::shared_future<std::shared_ptr<const Group>> future = promise.get_future().share();
  bool ready = false;
  uint64_t bytes = 0, last_use = 0;
};

namespace {

// `why` without the leading "path: " the reader's messages start with: the origin an error is
// reported with names the file once.
std::string WithoutPath(std::string why, const std::string& path) {
  if (why.rfind(path + ": ", 0) == 0) why.erase(0, path.size() + 2);
  return why;
}

}  // namespace

const json* Dataset::Row::column(size_t c) const {
  if (!decoded || c >= decoded->columns.size() || decoded->columns[c].empty()) return nullptr;
  return &decoded->columns[c][in_group];
}

Result<std::unique_ptr<Dataset>> Dataset::Open(const std::vector<std::string>& files,
                                               Options options, std::vector<Damage>* damage) {
  std::unique_ptr<Dataset> d(new Dataset());
  d->options_ = std::move(options);
  uint64_t h = HashString("parquet 1");
  for (const std::string& path : files) {
    File f;
    f.path = path;
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    struct stat st {};
    Status status = Status::Ok();
    if (fd < 0 || ::fstat(fd, &st) != 0)
      status = Status::Io(fmt::format("cannot open: {}", std::strerror(errno)));
    else if (!S_ISREG(st.st_mode))
      status = Status::Invalid("not a regular file");
    if (status.ok()) {
      Result<index_file::Stamp> stamp = index_file::Describe(fd, path, 4096);
      Result<FileMetaData> meta = ReadFooter(fd, static_cast<uint64_t>(st.st_size), path);
      if (!stamp.ok())
        status = stamp.status();
      else if (!meta.ok())
        status = meta.status();
      else {
        h = HashString(fmt::format("{}|{:016x}", path, index_file::Hash(*stamp)), h);
        f.meta = std::move(meta.value());
      }
    }
    if (fd >= 0) ::close(fd);
    if (!status.ok()) {
      damage->push_back({path, WithoutPath(status.message(), path)});
      continue;
    }
    f.tree = std::make_unique<SchemaTree>(f.meta);
    for (const RowGroup& g : f.meta.row_groups)
      f.starts.push_back(f.rows), f.rows += static_cast<uint64_t>(g.num_rows);
    for (const std::string& name : d->options_.columns) {
      const size_t top = f.tree->Top(f.meta, name);
      f.tops.push_back(top);
      f.leaves.emplace_back();
      for (size_t k = 0; k < f.meta.leaves.size() && top != SchemaTree::npos; ++k)
        if (f.meta.leaves[k].elements.front() == top) f.leaves.back().push_back(k);
    }
    f.first = d->total_;
    d->total_ += f.rows;
    for (size_t g = 0; g < f.starts.size(); ++g)
      d->groups_.push_back(
          {f.first + f.starts[g], static_cast<uint64_t>(f.meta.row_groups[g].num_rows)});
    d->files_.push_back(std::move(f));
  }
  d->fingerprint_ = h;
  return d;
}

std::string Dataset::ColumnType(size_t file, const std::string& name) const {
  const File& f = files_[file];
  const size_t top = f.tree->Top(f.meta, name);
  return top == SchemaTree::npos ? "" : TypeName(f.meta, *f.tree, top);
}

std::vector<std::string> Dataset::Columns(size_t file) const {
  const File& f = files_[file];
  std::vector<std::string> out;
  if (!f.tree->children.empty())
    for (size_t c : f.tree->children[0]) out.push_back(f.meta.schema[c].name);
  return out;
}

Result<std::shared_ptr<const Group>> Dataset::Decode(const File& f, size_t g) const {
  const RowGroup& rg = f.meta.row_groups[g];
  uint64_t decoded = 0;
  for (const std::vector<size_t>& leaves : f.leaves)
    for (size_t k : leaves) decoded += static_cast<uint64_t>(rg.columns[k].total_uncompressed_size);
  if (decoded > options_.cache_bytes)
    return Status::TooLarge(fmt::format(
        "its columns take {} bytes decoded, more than source.row_group_cache_bytes ({}): raise "
        "it, or write the file with smaller row groups",
        decoded, options_.cache_bytes));
  const int fd = ::open(f.path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::Io(fmt::format("cannot open: {}", std::strerror(errno)));
  auto group = std::make_shared<Group>();
  group->columns.resize(options_.columns.size());
  Status st = Status::Ok();
  for (size_t c = 0; st.ok() && c < options_.columns.size(); ++c) {
    if (f.tops[c] == SchemaTree::npos) continue;
    std::vector<ColumnValues> values;
    for (size_t k : f.leaves[c]) {
      const ColumnChunk& chunk = rg.columns[k];
      std::string bytes(static_cast<size_t>(chunk.total_compressed_size), '\0');
      if (!index_file::FullPread(fd, bytes.data(), bytes.size(),
                                 static_cast<uint64_t>(chunk.start()))) {
        st = Status::Io(fmt::format("reading column '{}': {}", fmt::join(chunk.path, "."),
                                    errno ? std::strerror(errno) : "the file is shorter"));
        break;
      }
      Result<ColumnValues> v = ReadColumn(bytes, chunk, f.meta.leaves[k], f.path);
      if (!v.ok()) {
        st = v.status();
        break;
      }
      group->bytes += v->data.size() + 64 * (v->definition.size() + v->size());
      values.push_back(std::move(v.value()));
    }
    if (!st.ok()) break;
    Result<std::vector<json>> rows =
        AssembleColumn(f.meta, *f.tree, f.tops[c], f.leaves[c], values, rg.num_rows, f.path);
    if (rows.ok())
      group->columns[c] = std::move(rows.value());
    else
      st = rows.status();
  }
  ::close(fd);
  if (!st.ok()) return st;
  return std::shared_ptr<const Group>(std::move(group));
}

void Dataset::EvictLocked() const {
  while (held_ > options_.cache_bytes) {
    auto oldest = cache_.end();
    for (auto it = cache_.begin(); it != cache_.end(); ++it)
      if (it->second->ready && it->second->bytes &&
          (oldest == cache_.end() || it->second->last_use < oldest->second->last_use))
        oldest = it;
    if (oldest == cache_.end()) return;
    held_ -= oldest->second->bytes;
    cache_.erase(oldest);
  }
}

Status Dataset::Read(size_t i, Row* row) const {
  const auto next = std::upper_bound(files_.begin(), files_.end(), static_cast<uint64_t>(i),
                                     [](uint64_t at, const File& f) { return at < f.first; });
  const size_t k = static_cast<size_t>(next - files_.begin()) - 1;
  const File& f = files_[k];
  row->file = k;
  row->row = i - f.first;
  row->group = static_cast<size_t>(std::upper_bound(f.starts.begin(), f.starts.end(), row->row) -
                                   f.starts.begin()) -
               1;
  row->in_group = row->row - f.starts[row->group];
  row->decoded.reset();
  std::shared_ptr<Slot> slot;
  bool mine = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::shared_ptr<Slot>& s = cache_[{k, row->group}];
    if (!s) {
      s = std::make_shared<Slot>();
      mine = true;
    }
    slot = s;
    slot->last_use = ++clock_;
  }
  if (mine) {
    Result<std::shared_ptr<const Group>> d = Decode(f, row->group);
    std::shared_ptr<const Group> g =
        d.ok()
            ? d.value()
            : std::make_shared<const Group>(Group{
                  Status(d.status().code(), fmt::format("row group {}: {}", row->group,
                                                        WithoutPath(d.status().message(), f.path))),
                  {},
                  0});
    slot->promise.set_value(g);
    std::lock_guard<std::mutex> lock(mu_);
    slot->ready = true;
    slot->bytes = g->bytes;
    held_ += g->bytes;
    if (!d.ok() && d.status().code() == Status::Code::kIo)
      cache_.erase({k, row->group});  // the file may be readable again: a later row retries
    EvictLocked();
  }
  row->decoded = slot->future.get();
  return row->decoded->status;
}

}  // namespace mmfeed::parquet
