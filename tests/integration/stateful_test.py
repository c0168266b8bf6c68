#!/usr/bin/env python3
"""The stream position under every sequence of events: a randomized stateful test.

Real mmfeedd daemons and real mmfeed-consume trainers are driven through a seeded random
sequence of operations, in the spirit of FoundationDB's simulation tests and Jepsen's
checkers:

  reload      one or more reloadable fields changed (seed, batch_size, drop_last, workers,
              text max_len, a token budget, consumers 2 <-> 3), by mmfeedctl reload or SIGHUP;
              a rank that consumers adds gets a trainer once the daemon serves it (without
              a cursor: it starts where the daemon puts it), one it removes ends its trainer
  storm       several such reloads in a row, most refused while one waits for its epoch
  edit-data   a new version of the data (24 samples replaced by new ones, in a new manifest
              the config's source.path names), reloaded, or the daemon killed and restarted
              on it
  kill-daemon SIGKILL of the daemon, then a restart with --state-dir, sometimes on a config
              edited meanwhile (a restart on an edited config)
  kill-rank   SIGKILL of a trainer, then a new one resuming from its cursor file: an
              mmfeed-consume --cursor, or (a third of the lives, where the Python module is
              built) a Python trainer with mmfeed.torch.MmfeedDataset's load_state_dict
              (half of those: a Python trainer on mmfeed.Client whose own SIGALRM handler raises
              KeyboardInterrupt, TimeoutError or an exception of its own around next(), and
              which catches them and goes on)
  stop-rank   SIGSTOP of a trainer (its rank lags, an epoch or more behind), SIGCONT later
  tamper-cache cached files edited in place, their size kept: the text stage's disk tier (every
              run has one) and, in the remote runs, the shards' disk cache
  edit-cursor a trainer killed and started on an edited copy of its cursor (a seq far ahead, a
              position past the end of the epoch, a position without its stream tag): it must
              be refused and receive nothing; then the trainer resumes from its own cursor
  wait        time passes

At the end every trainer is let run to the end of the data, and everything it received, over
all its lives, is checked against a small model of the stream:

  - per rank, batch seqs 0..K-1 with no gap; a seq received twice (a trainer killed between
    receiving a batch and saving its cursor) is the same batch; ranks 0 and 1 have the same K
    (rank 2, while consumers is 3, has seqs below K, in the epochs the others label alike);
  - epoch labels never go back, and each seq's epoch is the same whoever made it;
  - each epoch, over all ranks, is exactly one order's samples: no id twice, and every id of
    one version of the dataset except the rows drop_last leaves out; the versions go forward;
  - every row's text belongs to its id (no torn batch).

Even seeds read the data as WebDataset tar shards from an HTTP server (range requests, the
remote store's window-mode order; token budgets, which that order refuses, left out), odd seeds
from a manifest; seeds 3, 7, 11, ... (seed % 4 == 3: one in CI's short runs) from a weighted
mixture of two manifests instead, with one more operation and no edit-data:

  reweigh     the mixture's weights changed (3:1, 1:1, 1:3), mostly by `mmfeedctl reload
              --at batch` (every rank switches at one batch boundary), else at the next epoch

and, for its epochs, the model's "one order's samples" becomes: every id is one of the
mixture's, and no id comes more often in an epoch than the passes its source's draws there
span (no sample repeats within a pass). Seeds 2, 5, 8, ... (seed % 3 == 2: one in CI's short runs, sanitizers
included) run with `replicas: 2`: every stream is read by
two trainer ranks of a model-parallel group (ranks 2s and 2s + 1 read stream s; `consumers`
4 <-> 6), each killed, stopped and resumed on its own, and the two must receive the same
batches; the model above is checked on the streams.

A failing run prints its seed and its operations: `--seed S --ops N` replays the sequence.

usage: stateful_test.py --bin BUILD/bin [--seed S] [--runs R] [--ops N] [--long]
  CI runs the short mode (4 runs of 60 operations, 2 of 40 under the sanitizers); --long runs 20
  runs of 150 operations with seeds from the clock (docs/design/reliability.md).
"""
import argparse, json, os, pathlib, random, shutil, signal, subprocess, sys, tempfile, time

import numpy as np

import daemon_test

# A trainer in Python: MmfeedDataset through a DataLoader, resumed with load_state_dict from the
# cursor file mmfeed-consume keeps (the cursor, state_dict()["cursor"]), dumping as it does.
PY_TRAINER = r"""
import json, os, sys, time
import numpy as np, torch
import mmfeed.torch as mt
sock, rank, cursor_file, dump, hold = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
ds = mt.MmfeedDataset(socket=sock, rank=rank, reconnect_s=120)
if os.path.exists(cursor_file):
    with open(cursor_file) as f:
        ds.load_state_dict({"cursor": json.load(f)})
for n, b in enumerate(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=0)):
    d = os.path.join(dump, f"{n:06d}")
    os.makedirs(d)
    np.save(os.path.join(d, "text.npy"), b["text"].numpy())
    np.save(os.path.join(d, "text_lengths.npy"), b["text_lengths"].numpy())
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump({"seq": b["seq"], "epoch": b["epoch"], "ids": b["ids"]}, f)
    time.sleep(hold / 1000)
    with open(cursor_file + ".tmp", "w") as f:
        json.dump(ds.state_dict()["cursor"], f)
    os.replace(cursor_file + ".tmp", cursor_file)
    del b
"""
# A trainer in Python whose own signal handler raises exceptions (KeyboardInterrupt, TimeoutError,
# one of its own) at random points around mmfeed.Client.next(): it catches them and calls next()
# again, resuming from the cursor file mmfeed-consume keeps. No batch may be lost to them.
PY_INTERRUPTED = r"""
import json, os, random, signal, sys, time
import numpy as np
import mmfeed
sock, rank, cursor_file, dump, hold = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
class Preempted(Exception): pass
rng = random.Random(rank * 7919 + os.getpid())
state = {"armed": False}
def handler(signum, frame):
    if state["armed"]:
        state["armed"] = False
        raise rng.choice([KeyboardInterrupt, TimeoutError, Preempted])()
signal.signal(signal.SIGALRM, handler)
signal.setitimer(signal.ITIMER_REAL, 0.003, 0.0037)
resume = json.load(open(cursor_file)) if os.path.exists(cursor_file) else None
c = mmfeed.Client(socket=sock, rank=rank, resume=resume, reconnect_s=120)
n = 0
while True:
    try:
        state["armed"] = True
        b = c.next()
        state["armed"] = False
    except (KeyboardInterrupt, TimeoutError, Preempted):
        continue
    if b is None:
        break
    d = os.path.join(dump, f"{n:06d}")
    os.makedirs(d)
    np.save(os.path.join(d, "text.npy"), b["text"])
    np.save(os.path.join(d, "text_lengths.npy"), b["text_lengths"])
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump({"seq": b.seq, "epoch": b.epoch, "ids": b.ids}, f)
    n += 1
    time.sleep(hold / 1000)
    with open(cursor_file + ".tmp", "w") as f:
        json.dump(b.cursor, f)
    os.replace(cursor_file + ".tmp", cursor_file)
    b.release()
signal.setitimer(signal.ITIMER_REAL, 0)
"""
PYTHON_DIR = None  # BUILD/python when the Python module is built (not under the sanitizers)
VERBOSE = False  # --verbose: print every run's operations

SAMPLES = 480  # 2 ranks x 240
CONSUMERS = 2  # streams always served; stream 2 too while consumers is 3 (x replicas)
EPOCHS = 5  # set per run from the operations (run): the data must outlast them


def config(p):
    if p["mix"]:
        a, b = p["weights"].split(":")
        source = f"""sources:
  - {{name: a, type: manifest, path: a.jsonl, weight: {a}}}
  - {{name: b, type: manifest, path: b.jsonl, weight: {b}}}
mix: {{seed: {p['seed']}, epochs: {EPOCHS}, samples_per_epoch: {SAMPLES}}}"""
    else:
        kind = "type: webdataset, fields: {text: [txt]}" if p["remote"] else "type: manifest"
        # Remote shards kept in a disk cache whose files tamper-cache edits.
        cache = f", cache: {{dir: {p['work']}/shards, max_bytes: 1G}}" if p["remote"] else ""
        source = f"""source: {{{kind}, path: "{p['path']}", shuffle: true, seed: {p['seed']}, epochs: {EPOCHS}{cache}}}"""
    budget = f", max_tokens: {p['max_tokens']}" if p["max_tokens"] and not p["remote"] else ""
    return f"""pipeline: stateful
{source}
consumers: {p['consumers'] * p['replicas']}
replicas: {p['replicas']}
stages:
  - {{name: text, type: text, field: text, workers: {p['workers']},
     cache: {{max_bytes: 4K, disk: {{dir: {p['work']}/tier, max_bytes: 64M}}}},
     params: {{tokenizer: bytes, max_len: {p['max_len']}}}}}
  - {{name: batch, type: batch, inputs: [text], params: {{batch_size: {p['batch']}, drop_last: {str(p['drop_last']).lower()}{budget}}}}}
output: {{ring_slots: 4}}
on_error: fail
"""


FIELDS = {
    "seed": [1, 2, 3],
    "batch": [8, 12, 16],
    "drop_last": [False, True],
    "workers": [1, 2],
    "max_len": [24, 32],
    "max_tokens": [0, 0, 120],
    "consumers": [2, 3],
    "weights": ["3:1", "1:1", "1:3"],  # a mixture's only
}
MIX_A = 300  # a mixture's source a: the first 300 ids; b: the other 180


SHARDS = 10  # of 48 samples each, in the remote runs


class ShardServer:
    """Serves a folder over HTTP with HEAD and single-range GETs, as object storage does."""

    def __init__(self, root):
        import http.server, threading

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def body(self):
                try:
                    return (root / self.path.lstrip("/")).read_bytes()
                except OSError:
                    self.send_error(404)
                    return None

            def do_HEAD(self):
                body = self.body()
                if body is not None:
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()

            def do_GET(self):
                body = self.body()
                if body is None:
                    return
                want = self.headers.get("Range")
                first, last = (int(x) for x in want.split("=")[1].split("-")) if want else (0, len(body) - 1)
                self.send_response(206 if want else 200)
                if want:
                    self.send_header("Content-Range", f"bytes {first}-{last}/{len(body)}")
                self.send_header("Content-Length", str(last + 1 - first))
                self.end_headers()
                self.wfile.write(body[first:last + 1])

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


class World:
    """The daemon, the trainers and the files of one run."""

    def __init__(self, bin_dir, work, rng, log, remote, replicas, mix=False):
        self.bin, self.dir, self.rng, self.oplog = bin_dir, work, rng, log
        self.sock = str(work / "mmfeed.sock")
        self.params = {k: v[0] for k, v in FIELDS.items()}
        self.params["remote"] = remote
        self.params["mix"] = self.mix = mix
        self.params["replicas"] = self.replicas = replicas
        self.params["work"] = str(work)
        # Trainer ranks: those of the streams always served, then those of stream 2.
        self.ranks = list(range(CONSUMERS * replicas))
        self.extra = list(range(CONSUMERS * replicas, (CONSUMERS + 1) * replicas))
        self.server = ShardServer(work) if remote else None
        self.versions = []  # each version of the data: its ids
        self.next_id = SAMPLES
        self.daemon = None
        self.daemon_logs = []
        self.lives = {r: 0 for r in self.ranks + self.extra}
        self.trainers = {}
        self.stopped = set()
        self.write_data([f"s{i:04d}" for i in range(SAMPLES)])
        self.budgeted = False  # whether some epoch may have had token-budget batches
        self.write_config()
        # The config the daemon runs (or will, at a pending reload's boundary), None when not
        # known (after a SIGHUP, or a restart on a file that differs from it): reweighs start
        # from it, so that they change the weights alone.
        self.accepted = dict(self.params)

    def write_data(self, ids):
        """Writes version len(versions) of the data and points the config at it."""
        if self.mix:  # written once: a mixture's data is not edited
            for name, part in (("a.jsonl", ids[:MIX_A]), ("b.jsonl", ids[MIX_A:])):
                with open(self.dir / name, "w") as m:
                    for sid in part:
                        m.write(json.dumps({"id": sid, "text": f"caption {int(sid[1:])}"}) + "\n")
        elif self.server:
            import io, tarfile
            folder = self.dir / f"v{len(self.versions)}"
            folder.mkdir()
            per = len(ids) // SHARDS
            for k in range(SHARDS):
                with tarfile.open(folder / f"shard-{k:03d}.tar", "w", format=tarfile.USTAR_FORMAT) as t:
                    for sid in ids[k * per:(k + 1) * per]:
                        data = f"caption {int(sid[1:])}".encode()
                        info = tarfile.TarInfo(f"{sid}.txt")
                        info.size = len(data)
                        t.addfile(info, io.BytesIO(data))
            self.params["path"] = f"{self.server.url}/{folder.name}/shard-{{000..{SHARDS - 1:03d}}}.tar"
        else:
            name = f"manifest{len(self.versions)}.jsonl"
            with open(self.dir / name, "w") as m:
                for sid in ids:
                    m.write(json.dumps({"id": sid, "text": f"caption {int(sid[1:])}"}) + "\n")
            self.params["path"] = name
        self.versions.append(ids)

    def write_config(self):
        (self.dir / "p.yaml").write_text(config(self.params))
        self.budgeted |= bool(self.params["max_tokens"] and not self.params["remote"])

    def start_daemon(self):
        log = open(self.dir / f"daemon{len(self.daemon_logs)}.log", "w+")
        self.daemon_logs.append(log)
        self.daemon = subprocess.Popen(
            [f"{self.bin}/mmfeedd", "--config", str(self.dir / "p.yaml"), "--socket", self.sock, "--state-dir",
             str(self.dir / "state"), "--drain-timeout", "2"], stdout=log, stderr=log)
        deadline = time.time() + 60
        while not daemon_test.serving(self.sock):
            if self.daemon.poll() == 0:
                return  # restarted at the end of the data: nothing left to serve
            if self.daemon.poll() is not None or time.time() > deadline:
                raise Failure("the daemon did not start")
            time.sleep(0.02)

    def start_trainer(self, rank):
        life = self.lives[rank]
        self.lives[rank] += 1
        hold = self.rng.choice([10, 20, 40])
        cursor, dump = str(self.dir / f"cursor{rank}.json"), self.dir / f"r{rank}" / f"life{life:03d}"
        if PYTHON_DIR and self.rng.random() < 1 / 3:
            dump.mkdir(parents=True)
            interrupted = self.rng.random() < 0.5
            self.trainers[rank] = subprocess.Popen(
                ["/usr/bin/python3", "-c", PY_INTERRUPTED if interrupted else PY_TRAINER, self.sock, str(rank), cursor,
                 str(dump), str(hold)],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=PYTHON_DIR))
            return "python, interrupted by exceptions" if interrupted else "python"
        self.trainers[rank] = subprocess.Popen(
            [f"{self.bin}/mmfeed-consume", "--socket", self.sock, "--rank", str(rank), "--cursor", cursor,
             "--reconnect", "120", "--hold-ms", str(hold), "--dump", str(dump)], stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)
        return "mmfeed-consume"

    def served(self):
        """The trainer ranks the daemon serves now (status), or None when it does not answer."""
        r = self.ctl("status", "--json")
        return len(json.loads(r.stdout)["consumers"]) if r.returncode == 0 else None

    def sync_rank2(self):
        """Starts the trainers of stream 2 when the daemon serves it and none runs (new ones,
        without a cursor, after consumers removed the stream and added it again). Returns what
        it did."""
        idle = [r for r in self.extra if self.trainers.get(r) is None or self.trainers[r].poll() is not None]
        if not idle or self.served() != len(self.ranks + self.extra):
            return ""
        for r in idle:
            p = self.trainers.get(r)
            if p is not None:
                out, err = p.communicate()
                if p.returncode not in (0, -signal.SIGKILL) and not removed_rank(err):
                    raise Failure(f"trainer {r} failed ({p.returncode}): {err.strip()[-400:]}")
                (self.dir / f"cursor{r}.json").unlink(missing_ok=True)
            self.start_trainer(r)
        return f"; stream 2 served: trainer(s) {idle} started"

    def live_ranks(self):
        return [r for r, p in self.trainers.items() if p.poll() is None]

    def ctl(self, *args):
        return subprocess.run([f"{self.bin}/mmfeedctl", "--socket", self.sock, "--timeout", "60", *args],
                              capture_output=True, text=True, timeout=120)

    def daemon_log(self, tail=6000):
        text = ""
        for f in self.daemon_logs:
            f.flush()
            f.seek(0)
            log = f.read()
            text += f"--- {f.name}\n" + (log[-tail:] if tail else log)
        return text

    def close(self):
        for p in list(self.trainers.values()) + ([self.daemon] if self.daemon else []):
            if p.poll() is None:
                p.kill()
                p.wait()
        for f in self.daemon_logs:
            f.close()
        if self.server:
            self.server.close()


class Failure(Exception):
    pass


def removed_rank(err):
    """A trainer of stream 2 started (or resumed) while consumers was 3, refused once it was 2."""
    return " out of range: this pipeline has" in err


def mutate(w, n_fields):
    """Changes n random reloadable fields of the config file; returns what changed."""
    changed = {}
    for field in w.rng.sample(sorted(f for f in FIELDS if w.mix or f != "weights"), n_fields):
        choices = [v for v in FIELDS[field] if v != w.params[field]]
        if choices:
            w.params[field] = w.rng.choice(choices)
            changed[field] = w.params[field]
    if w.params["max_tokens"] and w.params["drop_last"]:  # refused together by the config check
        other = "drop_last" if "max_tokens" in changed else "max_tokens"
        w.params[other] = FIELDS[other][0]
        changed[other] = w.params[other]
    w.write_config()
    return changed


def op_reload(w):
    changed = mutate(w, w.rng.choice([1, 1, 2]))
    if w.rng.random() < 0.3:
        w.daemon.send_signal(signal.SIGHUP)
        w.accepted = None
        return f"reload by SIGHUP {changed}"
    r = w.ctl("reload", "--json")
    if r.returncode == 0:
        w.accepted = dict(w.params)
    what = json.loads(r.stdout)["applied"] if r.returncode == 0 else r.stderr.strip()[-120:]
    return f"reload {changed}: {what}"


def op_storm(w):
    outcomes = []
    for _ in range(w.rng.randint(3, 8)):
        mutate(w, 1)
        r = w.ctl("reload")
        outcomes.append("ok" if r.returncode == 0 else "refused")
        if r.returncode == 0:
            w.accepted = dict(w.params)
    return f"storm of {len(outcomes)} reloads: {' '.join(outcomes)}"


def op_reweigh(w):
    w.params = dict(w.accepted or w.params)
    w.params["weights"] = w.rng.choice([v for v in FIELDS["weights"] if v != w.params["weights"]])
    w.write_config()
    at = ["--at", "batch"] if w.rng.random() < 0.8 else []
    r = w.ctl("reload", *at, "--json")
    if r.returncode == 0:
        w.accepted = dict(w.params)
    what = json.loads(r.stdout)["applied"] if r.returncode == 0 else r.stderr.strip()[-160:]
    return f"reweigh to {w.params['weights']} {' '.join(at)}: {what}"


def op_kill_daemon(w):
    w.daemon.send_signal(signal.SIGKILL)
    w.daemon.wait()
    edited = ""
    if w.rng.random() < 0.5:
        edited = f", restarted on an edited config {mutate(w, 1)}"
    time.sleep(w.rng.choice([0, 0.05, 0.3]))
    if w.params != w.accepted:  # the daemon reloads the file once the trainers are back
        w.accepted = None
    w.start_daemon()
    return "kill -9 the daemon" + edited


def op_edit_data(w):
    ids = list(w.versions[-1])
    for k in sorted(w.rng.sample(range(len(ids)), 24)):
        ids[k] = f"s{w.next_id:04d}"
        w.next_id += 1
    w.write_data(ids)
    w.write_config()
    if w.rng.random() < 0.3:
        w.daemon.send_signal(signal.SIGKILL)
        w.daemon.wait()
        w.start_daemon()
        return f"data version {len(w.versions) - 1}, the daemon killed and restarted on it"
    r = w.ctl("reload", "--json")
    what = json.loads(r.stdout)["applied"] if r.returncode == 0 else r.stderr.strip()[-120:]
    return f"data version {len(w.versions) - 1}, reloaded: {what}"


def op_kill_rank(w):
    rank = w.rng.choice(w.live_ranks() or [0])
    p = w.trainers[rank]
    if p.poll() is None:
        p.send_signal(signal.SIGKILL)
        p.wait()
    w.stopped.discard(rank)
    kind = w.start_trainer(rank)
    return f"kill -9 trainer {rank}, resumed from its cursor by {kind}"


def op_stop_rank(w):
    rank = w.rng.choice(sorted(set(w.live_ranks()) | w.stopped) or [0])
    p = w.trainers[rank]
    if rank in w.stopped:
        p.send_signal(signal.SIGCONT)
        w.stopped.discard(rank)
        return f"SIGCONT trainer {rank}"
    if p.poll() is None:
        p.send_signal(signal.SIGSTOP)
        w.stopped.add(rank)
    return f"SIGSTOP trainer {rank}"


def op_tamper_cache(w):
    """Edits cached files in place, their size kept: the text stage's disk tier, and the remote
    shards' disk cache. The checksums must catch every one (the check finds any row whose text
    is not its id's)."""
    files = [f for f in (w.dir / "tier").glob("mmfeed-samples-*/*") if f.name.isdigit()]
    files += list((w.dir / "shards").glob("*.shard"))
    edited = 0
    for f in w.rng.sample(files, min(len(files), w.rng.choice([1, 3, 10]))):
        try:
            size = f.stat().st_size
            if size == 0:
                continue
            with open(f, "r+b") as fh:
                at = w.rng.randrange(size)
                fh.seek(at)
                b = fh.read(1)
                fh.seek(at)
                fh.write(bytes([b[0] ^ 0x41]))
            edited += 1
        except (OSError, IndexError):
            pass  # removed meanwhile
    return f"tamper-cache: {edited} cached file(s) edited in place"


def op_edit_cursor(w):
    """A trainer killed, then started on an edited copy of its cursor (a position past the end of
    the epoch, a position without its stream tag, a seq far ahead): refused, receiving nothing;
    then the trainer resumes from its honest cursor."""
    rank = w.rng.choice(w.ranks)
    path = w.dir / f"cursor{rank}.json"
    if not path.exists() or rank in w.stopped:
        return op_wait(w)
    p = w.trainers[rank]
    if p.poll() is None:
        p.send_signal(signal.SIGKILL)
        p.wait()
    honest = json.loads(path.read_text())
    edits = [dict(honest, seq=honest["seq"] + 10 ** 6)]
    if "position" in honest:
        edits.append(dict(honest, position=10 ** 9))
        edits.append({k: v for k, v in honest.items() if k != "stream"})
    edited = w.rng.choice(edits)
    forged = w.dir / f"edited{rank}.json"
    forged.write_text(json.dumps(edited))
    dump = w.dir / f"edited-dump{rank}"
    r = subprocess.run([f"{w.bin}/mmfeed-consume", "--socket", w.sock, "--rank", str(rank), "--cursor", str(forged),
                        "--dump", str(dump)], capture_output=True, text=True, timeout=60)
    if r.returncode == 0 or (dump.exists() and any(dump.iterdir())):
        raise Failure(f"trainer {rank} resumed from an edited cursor {edited}: {r.stderr.strip()[-300:]}")
    kind = w.start_trainer(rank)
    what = "seq" if edited["seq"] != honest["seq"] else "position" if "stream" in edited else "stream tag"
    return f"edit-cursor of trainer {rank} ({what}): refused ({r.stderr.strip()[-90:]}); resumed by {kind}"


def op_wait(w):
    t = w.rng.choice([0.05, 0.2, 0.5])
    time.sleep(t)
    return f"wait {t}s"


OPS = [(op_reload, 5), (op_storm, 1), (op_edit_data, 1), (op_kill_daemon, 2), (op_kill_rank, 3), (op_stop_rank, 2),
       (op_tamper_cache, 1), (op_edit_cursor, 1), (op_wait, 4)]
# A mixture's: reweighs most, other reloads less (their epoch boundaries hold reweighs off).
MIX_OPS = [(op_reweigh, 6), (op_reload, 2), (op_kill_daemon, 2), (op_kill_rank, 3), (op_stop_rank, 2),
           (op_tamper_cache, 1), (op_edit_cursor, 1), (op_wait, 4)]


def received(w, rank):
    """Every batch rank `rank` received over all its trainers' lives: {seq: (epoch, ids)}."""
    by_seq = {}
    for life in sorted((w.dir / f"r{rank}").glob("life*")):
        dumped = sorted(life.iterdir())
        for b in dumped:
            try:
                meta = json.loads((b / "meta.json").read_text())
                text, lengths = np.load(b / "text.npy"), np.load(b / "text_lengths.npy")
            except (OSError, ValueError):
                if b == dumped[-1]:  # a trainer killed while it wrote the batch out
                    continue
                raise Failure(f"{b}: a torn dump that is not a killed trainer's last")
            for k, sid in enumerate(meta["ids"]):
                got = bytes(text[k, :lengths[k]].astype(np.uint8)).decode()
                if got != f"caption {int(sid[1:])}":
                    raise Failure(f"rank {rank} seq {meta['seq']} row {k}: text {got!r} is not {sid}'s")
            seen = by_seq.setdefault(meta["seq"], (meta["epoch"], meta["ids"]))
            if seen != (meta["epoch"], meta["ids"]):
                raise Failure(f"rank {rank}: seq {meta['seq']} delivered twice with different batches: "
                              f"{seen} then {(meta['epoch'], meta['ids'])}")
    return by_seq


def check(w):
    # Per stream, what its first rank received; the other ranks of its group must have
    # received the same batches (stream 2's ranks may have started at other times: the same
    # batch for each seq both have).
    streams = []
    for s in range(CONSUMERS + 1):
        group = [received(w, r) for r in range(s * w.replicas, (s + 1) * w.replicas)
                 if (w.dir / f"r{r}").exists()]
        for k, other in enumerate(group[1:], 1):
            same = set(other) == set(group[0]) if s < CONSUMERS else True
            if not same or any(group[0][q] != other[q] for q in set(other) & set(group[0])):
                raise Failure(f"stream {s}: rank {s * w.replicas + k} did not receive what rank "
                              f"{s * w.replicas} did (replicas)")
        streams.append(group[0] if group else {})
    ranks, extra = streams[:CONSUMERS], streams[CONSUMERS]
    counts = [len(r) for r in ranks]
    for seq, (epoch, _) in extra.items():
        if seq >= counts[0] or ranks[0].get(seq, (None,))[0] != epoch:
            raise Failure(f"rank 2: seq {seq} in epoch {epoch}, which rank 0 labels otherwise")
    for rank, by_seq in enumerate(ranks):
        if sorted(by_seq) != list(range(len(by_seq))):
            missing = sorted(set(range(max(by_seq) + 1)) - set(by_seq))
            raise Failure(f"rank {rank}: seqs have a gap: missing {missing[:20]}")
        epochs = [by_seq[s][0] for s in sorted(by_seq)]
        if epochs != sorted(epochs):
            raise Failure(f"rank {rank}: the epoch label goes back: {epochs}")
    if len(set(counts)) != 1:
        raise Failure(f"ranks received unequal batch counts: {counts}")
    labels = [[ranks[r][s][0] for s in sorted(ranks[r])] for r in range(CONSUMERS)]
    # Ranks number their batches alike: the same seq is in the same epoch on every rank.
    if any(l != labels[0] for l in labels):
        raise Failure("ranks disagree on which epoch a seq is in")
    if sorted(set(labels[0])) != list(range(EPOCHS)):
        raise Failure(f"epochs received: {sorted(set(labels[0]))}, want 0..{EPOCHS - 1}")
    # drop_last leaves out each rank's last partial batch; token budgets fewer samples than the
    # ranks, when an epoch's last step could not give each rank a batch (engine/budget.h)
    allowed = {0} | {n * (SAMPLES // n % b) for b in FIELDS["batch"] for n in FIELDS["consumers"]}
    if w.budgeted:
        allowed |= set(range(1, max(FIELDS["consumers"])))
    if w.mix:
        # Its data never changes: every restart continues the saved stream, switches and all.
        if "starting fresh" in w.daemon_log(tail=None):
            raise Failure("a restarted daemon did not continue the saved stream (starting fresh)")
        check_mix_epochs(ranks + [extra], allowed)
        return counts[0], [], len(extra)
    version, by_epoch = 0, []
    for e in range(EPOCHS):
        got = [i for r in ranks + [extra] for s in sorted(r) if r[s][0] == e for i in r[s][1]]
        dup = len(got) - len(set(got))
        if dup:
            # Where each of a few repeated ids was delivered: which rank, which seqs.
            where = {}
            for name, r in zip(["rank 0", "rank 1", "rank 2"], ranks + [extra]):
                for s in sorted(r):
                    for i in r[s][1]:
                        if r[s][0] == e and got.count(i) > 1:
                            where.setdefault(i, []).append(f"{name} seq {s}")
            first = "; ".join(f"{i}: {', '.join(v)}" for i, v in list(where.items())[:4])
            raise Failure(f"epoch {e}: {dup} id(s) delivered twice (two orders mixed), e.g. {first}")
        # The epoch is one version of the data (every version has SAMPLES ids), not older than
        # the epoch before's.
        fits = [v for v in range(version, len(w.versions)) if set(got) <= set(w.versions[v])]
        if not fits:
            raise Failure(f"epoch {e}: its ids are no version of the data from version {version} on")
        version = fits[0]
        by_epoch.append(version)
        left_out = SAMPLES - len(got)
        if left_out not in allowed:
            raise Failure(f"epoch {e}: {left_out} id(s) of data version {version} missing")
    return counts[0], by_epoch, len(extra)


def check_mix_epochs(streams, allowed):
    """A mixture's epochs: every id one of the mixture's, none more often than the passes its
    source's draws in the epoch span (a pass repeats no sample; after a switch of the weights
    at a batch boundary the draws go on in the pass they were in), all positions but what
    drop_last leaves out."""
    for e in range(EPOCHS):
        got = [i for r in streams for s in sorted(r) if r[s][0] == e for i in r[s][1]]
        counts = {}
        for i in got:
            if not (i[0] == "s" and 0 <= int(i[1:]) < SAMPLES):
                raise Failure(f"epoch {e}: {i} is none of the mixture's samples")
            counts[i] = counts.get(i, 0) + 1
        for name, ids in (("a", range(MIX_A)), ("b", range(MIX_A, SAMPLES))):
            drawn = sum(counts.get(f"s{k:04d}", 0) for k in ids)
            most = max(counts.get(f"s{k:04d}", 0) for k in ids)
            if most > -(-drawn // len(ids)) + 1:
                raise Failure(f"epoch {e}: a sample of source {name} came {most} times in {drawn} draws of "
                              f"{len(ids)}: a pass repeated it")
        if SAMPLES - len(got) not in allowed:
            raise Failure(f"epoch {e}: {SAMPLES - len(got)} position(s) missing")


def run(bin_dir, seed, n_ops):
    global EPOCHS
    EPOCHS = max(5, n_ops // 4)
    rng = random.Random(seed)
    work = pathlib.Path(tempfile.mkdtemp(prefix=f"mmfeed-stateful-{seed}-"))
    log = []
    w = World(bin_dir, work, rng, log, remote=seed % 2 == 0, replicas=2 if seed % 3 == 2 else 1,
              mix=seed % 4 == 3)
    try:
        w.start_daemon()
        for r in w.ranks:
            w.start_trainer(r)
        ops, weights = zip(*(OPS if not w.mix else MIX_OPS))
        done = 0
        for i in range(n_ops):
            if w.daemon.poll() is not None:
                log.append(f"the daemon exited ({w.daemon.returncode}) before operation {i}: the data ended")
                break
            op = rng.choices(ops, weights)[0]
            log.append(f"{i:3d} {op(w)}{w.sync_rank2()}")
            done += 1
        for r in sorted(w.stopped):
            w.trainers[r].send_signal(signal.SIGCONT)
        w.stopped.clear()
        log.append("run to the end")
        # Rank 2 may come (a pending reload adds it) or go until the data ends.
        deadline = time.time() + 300
        while w.daemon.poll() is None and time.time() < deadline:
            if w.sync_rank2():
                log.append("stream 2 served: its trainers started")
            time.sleep(0.2)
        for r, p in w.trainers.items():
            try:
                out, err = p.communicate(timeout=300)
            except subprocess.TimeoutExpired:
                raise Failure(f"trainer {r} did not finish")
            if p.returncode != 0:
                # A trainer restarted after the daemon had served the whole run finds no daemon;
                # what the trainers received is checked below all the same.
                ended = w.daemon.poll() == 0 and ("cannot connect" in err or "went away" in err)
                if not ended and r in w.extra and removed_rank(err):
                    log.append(f"trainer {r} (re)started for a stream a reload then removed: refused")
                elif not ended:
                    raise Failure(f"trainer {r} failed ({p.returncode}): {err.strip()[-400:]}")
                else:
                    log.append(f"trainer {r} started after the end of the data: {err.strip()[-120:]}")
        try:
            code = w.daemon.wait(10)
        except subprocess.TimeoutExpired:
            # A daemon killed within 100 ms of a trainer's last release saved the cursor before
            # it: restarted, it waits for that batch to be taken again, and nobody comes.
            w.daemon.send_signal(signal.SIGTERM)
            code = w.daemon.wait(60)
            log.append(f"the daemon was stopped with SIGTERM: exit {code}")
            if code not in (0, 3):
                raise Failure(f"the daemon exited {code} on SIGTERM")
        else:
            if code != 0:
                raise Failure(f"the daemon exited {code}")
        batches, versions, rank2 = check(w)
        print(f"seed {seed} ({'remote shards' if w.server else 'a mixture' if w.mix else 'a manifest'}"
              f"{', replicas 2' if w.replicas > 1 else ''}): {done} of {n_ops} operations before the end of the data, "
              f"{batches} batches per stream in {EPOCHS} epochs ({rank2} on stream 2 while consumers was 3), "
              + ("every epoch within its passes" if w.mix else f"every epoch exact (data versions by epoch: {versions})"),
              flush=True)
        if VERBOSE:
            print("operations:\n  " + "\n  ".join(log))
        shutil.rmtree(work, ignore_errors=True)
        return True
    except Failure as e:
        print(f"FAILED: seed {seed} ({n_ops} operations; replay: --seed {seed} --ops {n_ops}): {e}")
        print("operations:\n  " + "\n  ".join(log))
        print(w.daemon_log())
        print(f"(files kept in {work})")
        return False
    finally:
        w.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--seed", type=int, help="run this seed only")
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--ops", type=int, help="operations per run (default 60, 40 under the sanitizers)")
    ap.add_argument("--long", action="store_true", help="20 runs of 150 operations, seeds from the clock")
    ap.add_argument("--verbose", action="store_true", help="print every run's operations")
    a = ap.parse_args()
    bin_dir = os.path.abspath(a.bin)
    if a.long:
        a.runs, a.ops = 20, 150
    elif "libasan" in subprocess.run(["ldd", f"{bin_dir}/mmfeedd"], capture_output=True, text=True).stdout:
        # The sanitizer build is several times slower: half the runs, fewer operations.
        a.runs = max(1, a.runs // 2)
        a.ops = a.ops or 40
    a.ops = a.ops or 60
    global PYTHON_DIR, VERBOSE
    VERBOSE = a.verbose
    python = pathlib.Path(bin_dir).parent / "python"
    if (python / "mmfeed").is_dir() and subprocess.run(
            ["/usr/bin/python3", "-c", "import torch, mmfeed.torch"], env=dict(os.environ, PYTHONPATH=str(python)),
            capture_output=True).returncode == 0:
        PYTHON_DIR = str(python)
    first = int(time.time()) % 100000 if a.long else 1
    seeds = [a.seed] if a.seed is not None else [first + k for k in range(a.runs)]
    ok = all([run(bin_dir, s, a.ops) for s in seeds])
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
