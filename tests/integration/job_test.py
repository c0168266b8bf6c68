#!/usr/bin/env python3
"""Elastic jobs (issue #31): the trainers declare the job, and a job resumes at another shape. The real mmfeedd with
`consumers: auto` and `node_rank`/`num_nodes: auto` adopts the shape the first trainer's
launcher put in its environment (torchrun's or Slurm's variables, read by the client library
in mmfeed-consume), serves exactly what an explicit config of that shape serves, refuses a
conflicting shape naming both, and tells a trainer without a job how to declare one.

usage: job_test.py --bin BUILD/bin
"""
import json, os, pathlib, shutil, subprocess, sys, time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import contracts_test as ct  # noqa: E402
import daemon_test as dt  # noqa: E402

LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "SLURM_PROCID",
                 "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_NNODES", "SLURM_NTASKS_PER_NODE",
                 "MMFEED_REPLICAS")


def config(consumers="auto", node="node_rank: auto, num_nodes: auto"):
    return f"""pipeline: job
source: {{type: manifest, path: manifest.jsonl, shuffle: true, seed: 5, epochs: 2, {node}}}
consumers: {consumers}
stages:
  - {{name: text, type: text, field: text, params: {{tokenizer: bytes, max_len: 16}}}}
  - {{name: batch, type: batch, inputs: [text], params: {{batch_size: 4}}}}
output: {{ring_slots: 4}}
"""


def torchrun(node, local_rank, nodes=2, per_node=2):
    return {"RANK": str(node * per_node + local_rank), "WORLD_SIZE": str(nodes * per_node),
            "LOCAL_RANK": str(local_rank), "LOCAL_WORLD_SIZE": str(per_node), "GROUP_RANK": str(node)}


def slurm(node, local_rank, nodes=2, per_node=2):
    return {"SLURM_PROCID": str(node * per_node + local_rank), "SLURM_NTASKS": str(nodes * per_node),
            "SLURM_LOCALID": str(local_rank), "SLURM_NODEID": str(node), "SLURM_NNODES": str(nodes)}


class JobCase(dt.DaemonCase):
    """A manifest of 96 captions, and trainers in a launcher's environment."""

    def setUp(self):
        super().setUp()
        with open(self.dir / "manifest.jsonl", "w") as f:
            for i in range(96):
                f.write(json.dumps({"id": f"s{i:03d}", "text": f"caption {i}"}) + "\n")

    def consume(self, d, env, *args):
        """mmfeed-consume without --rank, in a launcher's environment `env`."""
        clean = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
        return subprocess.Popen([f"{dt.BIN}/mmfeed-consume", "--socket", d.socket, *args], env={**clean, **env},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def refused(self, d, env, *args):
        """mmfeed-consume's error when its attach is refused (exit status 1)."""
        c = self.consume(d, env, *args)
        _, err = c.communicate(timeout=30)
        self.assertEqual(c.returncode, 1, err)
        return err


class JobTest(JobCase):
    def explicit_ids(self):
        """Per rank, the ids node 1 of 2 with 2 consumer ranks serves, from an explicit config."""
        d = dt.Daemon(self.dir, config(2, "node_rank: 1, num_nodes: 2"))
        outs = [dt.finish(c) for c in [d.consume(r, "--json") for r in (0, 1)]]
        self.assertEqual(d.wait(), 0, d.log())
        return [o["sample_ids_sha256"] for o in outs], [o["samples"] for o in outs]

    def run_declared(self, env_of):
        d = dt.Daemon(self.dir, config())
        status = json.loads(d.ctl("status", "--json").stdout)
        self.assertEqual(status["state"], "waiting for the job")
        self.assertEqual(status["job"]["from"], "waiting for the first trainer")
        self.assertIn("the job's shape comes from the first trainer", d.ctl("status").stdout + d.log())
        cs = [self.consume(d, env_of(1, r), "--json", "--hold-ms", "2") for r in (0, 1)]
        outs = [dt.finish(c) for c in cs]
        self.assertEqual(d.wait(), 0, d.log())
        return [o["sample_ids_sha256"] for o in outs], [o["samples"] for o in outs], d

    def test_consumers_auto_adopts_torchruns_shape_and_serves_what_an_explicit_config_does(self):
        want = self.explicit_ids()
        got_hash, got_samples, d = self.run_declared(torchrun)
        self.assertEqual((got_hash, got_samples), want)
        self.assertEqual(got_samples, [48, 48], "96 samples over 2 nodes x 2 ranks, 2 epochs")
        self.assertRegex(d.log(), r"the job, as pid \d+ \(torchrun\) declares it: 2 node\(s\) x 2 rank\(s\), "
                                  r"this node 1; serving 2 consumer rank\(s\) as node 1 of 2")

    def test_slurm_variables_are_read_as_well(self):
        want = self.explicit_ids()
        got_hash, got_samples, d = self.run_declared(slurm)
        self.assertEqual((got_hash, got_samples), want)
        self.assertIn("(slurm) declares it", d.log())

    def test_a_conflicting_shape_is_refused_naming_both_and_status_shows_the_job(self):
        d = dt.Daemon(self.dir, config())
        first = self.consume(d, torchrun(1, 0), "--json", "--hold-ms", "20")
        for _ in range(200):  # until the first attach made the pipeline
            status = json.loads(d.ctl("status", "--json").stdout)
            if status["state"] != "waiting for the job":
                break
            time.sleep(0.05)
        self.assertEqual((status["job"]["consumers"], status["job"]["node_rank"], status["job"]["num_nodes"]),
                         (2, 1, 2))
        self.assertRegex(status["job"]["from"], r"pid \d+ \(torchrun\)")
        self.assertEqual(status["job"]["declared"]["world_size"], 4)
        self.assertIn("job: 2 consumer rank(s), node 1 of 2 (from pid", d.ctl("status").stdout)
        err = self.refused(d, torchrun(0, 1, nodes=1, per_node=4), "--json")
        self.assertIn("the trainer's job (torchrun: 1 node(s) x 4 rank(s), this node 0) conflicts with the job "
                      "this daemon serves (pid", err)
        self.assertIn("(torchrun): 2 node(s) x 2 rank(s), this node 1)", err)
        second = self.consume(d, torchrun(1, 1), "--json")
        for c in (first, second):
            dt.finish(c)
        self.assertEqual(d.wait(), 0, d.log())

    def test_a_job_whose_trainers_left_frees_the_daemon_after_its_lease(self):
        """A stray trainer declaring 1x4 takes two batches and leaves: it once fixed the daemon's
        shape until a restart (the real job refused for good, the daemon never ending). Now
        the real job is told how long until the stray one frees the daemon, and after the lease
        (--job-lease 2) it is served whole."""
        state = self.dir / "state"
        d = dt.Daemon(self.dir, config(), extra=("--job-lease", "2", "--state-dir", str(state)))
        dt.finish(self.consume(d, torchrun(0, 0, nodes=1, per_node=4), "--batches", "2", "--json"))
        err = self.refused(d, torchrun(0, 0, nodes=1, per_node=2))
        self.assertIn("conflicts with the job this daemon serves (pid", err)
        self.assertRegex(err, r"no trainer of it is attached; it frees in \d s \(mmfeedd --job-lease 2\), or at once "
                              r"with `mmfeedctl end-job`")
        status = json.loads(d.ctl("status", "--json").stdout)
        self.assertIn("it frees in", status["job"]["frees"])
        for _ in range(100):
            if json.loads(d.ctl("status", "--json").stdout)["state"] == "waiting for the job":
                break
            time.sleep(0.05)
        self.assertIn("the job ended (no trainer attached for 2 s (--job-lease))", d.log())
        self.assertTrue((state / "cursors.json").exists(), "its cursors kept as at an end")
        outs = [dt.finish(c) for c in [self.consume(d, torchrun(0, r, nodes=1, per_node=2), "--json")
                                       for r in range(2)]]
        self.assertEqual([o["samples"] for o in outs], [96, 96], "the real job: both epochs, whole")
        self.assertEqual(d.wait(), 0, d.log())

    def test_end_job_frees_the_daemon_at_once_once_no_trainer_is_attached(self):
        d = dt.Daemon(self.dir, config())
        held = self.consume(d, torchrun(0, 0, nodes=1, per_node=1), "--json", "--hold-ms", "200")
        for _ in range(200):
            if json.loads(d.ctl("status", "--json").stdout)["state"] != "waiting for the job":
                break
            time.sleep(0.05)
        r = d.ctl("end-job")
        self.assertEqual(r.returncode, 1)
        self.assertRegex(r.stderr, r"1 trainer\(s\) of the job are attached \(pid \d+\): stop them first")
        err = self.refused(d, torchrun(0, 0, nodes=1, per_node=2))
        self.assertIn("1 of its trainers attached; it frees 120 s after the last one leaves (mmfeedd --job-lease)",
                      err)
        held.kill()
        held.communicate()
        for _ in range(100):
            r = d.ctl("end-job")
            if r.returncode == 0:
                break
            time.sleep(0.05)  # until the daemon saw it go
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertRegex(r.stdout, r"ended the job 1 node\(s\) x 1 rank\(s\), this node 0 \(pid \d+ \(torchrun\)\); "
                                   r"waiting for the next job's shape")
        outs = [dt.finish(c) for c in [self.consume(d, torchrun(0, r, nodes=1, per_node=2), "--json")
                                       for r in range(2)]]
        self.assertEqual([o["samples"] for o in outs], [96, 96])
        self.assertEqual(d.wait(), 0, d.log())
        r = subprocess.run([f"{dt.BIN}/mmfeedctl", "--socket", d.socket, "end-job"], capture_output=True, text=True)
        self.assertNotEqual(r.returncode, 0)

    def test_an_attach_without_a_job_is_told_how_to_declare_one_and_job_declares_it(self):
        d = dt.Daemon(self.dir, config())
        err = self.refused(d, {}, "--rank", "0", "--batches", "1")
        self.assertIn("this daemon takes the job's shape from its trainers (`consumers: auto`", err)
        self.assertIn("mmfeed-consume --job NUM_NODES,NODE_RANK,LOCAL_WORLD_SIZE", err)
        outs = [dt.finish(self.consume(d, {}, "--rank", "0", "--job", "1,0,1", "--json"))]
        self.assertEqual(d.wait(), 0, d.log())
        self.assertEqual(outs[0]["samples"], 192, "one node, one rank: every sample of both epochs")
        self.assertIn("(arguments) declares it: 1 node(s) x 1 rank(s), this node 0", d.log())

    def test_an_explicit_config_keeps_its_shape_and_warns_of_another(self):
        d = dt.Daemon(self.dir, config(2, "node_rank: 0, num_nodes: 1"))
        outs = [dt.finish(c) for c in [self.consume(d, torchrun(0, r, nodes=1, per_node=4), "--rank", str(r),
                                                    "--json") for r in (0, 1)]]
        self.assertEqual(d.wait(), 0, d.log())
        self.assertEqual([o["samples"] for o in outs], [96, 96])
        self.assertIn("'s job (1 node(s) x 4 rank(s), this node 0) is not the shape", d.log())
        self.assertEqual(d.log().count("is not the shape"), 1, "warned once per shape")

    def test_before_the_first_trainer_reload_and_profile_say_why_not_and_stop_ends_it(self):
        d = dt.Daemon(self.dir, config())
        r = d.ctl("reload")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("no trainer has declared the job's shape yet (consumers: auto)", r.stderr)
        r = d.ctl("profile", "--seconds", "0.1")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("it starts when the first trainer declares the job's shape", r.stderr)
        self.assertIn("waiting for the job", d.ctl("status").stdout)
        self.assertEqual(d.ctl("stop").returncode, 0)
        self.assertEqual(d.wait(), 0, d.log())

    def test_a_job_that_cannot_be_served_is_refused_and_the_daemon_waits_for_another(self):
        d = dt.Daemon(self.dir, config())
        # 96 samples cannot be dealt to 100 nodes of 2 ranks: refused, nothing made, still waiting.
        err = self.refused(d, {}, "--rank", "0", "--job", "100,3,2")
        self.assertIn("the job 100 node(s) x 2 rank(s), this node 3 cannot be served: ", err)
        self.assertIn("cannot be dealt to 100 node(s) x 2 consumer(s)", err)
        self.assertEqual(json.loads(d.ctl("status", "--json").stdout)["state"], "waiting for the job")
        out = dt.finish(self.consume(d, {}, "--rank", "0", "--job", "1,0,1", "--json"))
        self.assertEqual(out["samples"], 192)
        self.assertEqual(d.wait(), 0, d.log())

    def test_another_launchers_variables_do_not_stop_an_attach(self):
        """RANK, WORLD_SIZE and LOCAL_RANK without the rest (DeepSpeed's, MPI wrappers') are no
        job: the rank comes from LOCAL_RANK as before; with --rank even a malformed one is
        ignored."""
        d = dt.Daemon(self.dir, config(2, "node_rank: 0, num_nodes: 1"))
        partial = self.consume(d, {"RANK": "1", "WORLD_SIZE": "8", "LOCAL_RANK": "1"}, "--json")
        explicit = self.consume(d, {"WORLD_SIZE": "eight"}, "--rank", "0", "--json")
        outs = [dt.finish(c) for c in (partial, explicit)]
        self.assertEqual(d.wait(), 0, d.log())
        self.assertEqual([o["samples"] for o in outs], [96, 96])
        self.assertNotIn("declares it", d.log())

    def test_a_config_reloaded_to_auto_keeps_its_shape_and_takes_declared_jobs(self):
        d = dt.Daemon(self.dir, config(2, "node_rank: 0, num_nodes: 1"))
        (self.dir / "auto.yaml").write_text(config())
        r = d.ctl("reload", "--config", str(self.dir / "auto.yaml"), "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        status = json.loads(d.ctl("status", "--json").stdout)
        self.assertEqual((status["job"]["consumers"], status["job"]["from"]), (2, "config"))
        outs = [dt.finish(c) for c in [self.consume(d, torchrun(0, r, nodes=1, per_node=2), "--json")
                                       for r in (0, 1)]]
        self.assertEqual(d.wait(), 0, d.log())
        self.assertEqual([o["samples"] for o in outs], [96, 96])

    def test_a_malformed_launcher_variable_is_named(self):
        d = dt.Daemon(self.dir, config())
        env = torchrun(0, 0)
        env["WORLD_SIZE"] = "four"
        err = self.refused(d, env)
        self.assertIn("$WORLD_SIZE is 'four', not a rank or a count", err)
        env = torchrun(0, 0)
        env["WORLD_SIZE"] = "3"
        err = self.refused(d, env)
        self.assertIn("$WORLD_SIZE 3 is not a multiple of $LOCAL_WORLD_SIZE 2", err)
        d.ctl("stop")
        self.assertEqual(d.wait(), 0, d.log())

    def test_trainers_started_by_a_real_torchrun_declare_the_job(self):
        """torchrun (python3-torch's, --standalone) starts two Python trainers using
        mmfeed.Client() with no rank: each attaches with its LOCAL_RANK and declares the job;
        together they get every sample once an epoch."""
        torchrun, pydir = shutil.which("torchrun", path="/usr/bin:/usr/local/bin"), pathlib.Path(dt.BIN).parent / "python"
        if not torchrun or not (pydir / "mmfeed").is_dir():
            self.skipTest(f"needs /usr/bin/torchrun (python3-torch) and the Python client in {pydir}")
        d = dt.Daemon(self.dir, config())
        worker = self.dir / "worker.py"
        worker.write_text(f"""import json, os, sys
sys.path.insert(0, {str(pydir)!r})
import mmfeed
ids = []
for batch in mmfeed.Client(socket={d.socket!r}, timeout_s=60):
    ids.append((batch.epoch, list(batch.ids)))
    del batch
with open(os.path.join({str(self.dir)!r}, "rank%s.json" % os.environ["LOCAL_RANK"]), "w") as f:
    json.dump(ids, f)
""")
        clean = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
        # --redirects/--tee 1: Debian's torch 1.13 cannot parse their default "0" under Python 3.11.
        r = subprocess.run([torchrun, "--standalone", "--nnodes", "1", "--nproc_per_node", "2", "--redirects", "1",
                            "--tee", "1", "--log_dir", str(self.dir / "torchrun"), str(worker)],
                           env=clean, capture_output=True, text=True, timeout=240)
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        self.assertEqual(d.wait(), 0, d.log())
        self.assertIn("(torchrun) declares it: 1 node(s) x 2 rank(s), this node 0", d.log())
        for epoch in (0, 1):
            got = [i for rank in (0, 1) for e, ids in json.loads((self.dir / f"rank{rank}.json").read_text())
                   if e == epoch for i in ids]
            self.assertEqual(sorted(got), [f"s{i:03d}" for i in range(96)], f"epoch {epoch}")

    def test_a_node_service_restarted_on_an_edited_config_continues_its_stream_then_reloads(self):
        # A consumers: auto daemon's saved stream names the job's shape, which only the first
        # trainer declares: the edited config waits for it, then the kept config continues the
        # stream and the edit (batch_size 4 -> 8) applies at the epoch boundary.
        # The boundary is the furthest rank's next once every rank's trainer is back: a trainer
        # slow to come back (the sanitizer build) moves it an epoch on, so the run has three.
        state = ("--state-dir", str(self.dir / "state"))
        three = config().replace("epochs: 2", "epochs: 3")
        d = dt.Daemon(self.dir, three, extra=state)
        args = lambda r, life: ("--json", "--cursor", str(self.dir / f"c{r}.json"), "--dump",
                                str(self.dir / f"{life}{r}"))
        for p in [self.consume(d, torchrun(0, r, 1, 2), *args(r, "a"), "--batches", "3") for r in range(2)]:
            dt.finish(p)
        d.proc.kill()
        d.proc.wait()
        d = dt.Daemon(self.dir, three.replace("batch_size: 4", "batch_size: 8"), extra=state)
        for p in [self.consume(d, torchrun(0, r, 1, 2), *args(r, "b")) for r in range(2)]:
            dt.finish(p)
        self.assertEqual(d.wait(), 0, d.log())
        self.assertIn("decided when the first trainer declares the job", d.log())
        self.assertIn("continuing the stream with that config", d.log())
        self.assertNotIn("starting fresh", d.log())
        later = [meta for r in range(2) for meta, _ in dt.dumped_batches(self.dir / f"b{r}")]
        sizes = [{len(m["ids"]) for m in later if m["epoch"] == e} for e in range(3)]
        self.assertEqual(sizes[0], {4}, "epoch 0: the kept config")
        self.assertTrue(all(len(s) == 1 for s in sizes), f"an epoch of one config each: {sizes}")
        self.assertEqual(sizes[2], {8}, f"the edited config from an epoch boundary on: {sizes}")
        ids = [i for r in range(2) for life in "ab" for meta, _ in dt.dumped_batches(self.dir / f"{life}{r}")
               if meta["epoch"] == 0 for i in meta["ids"]]
        self.assertEqual(sorted(ids), [f"s{i:03d}" for i in range(96)], "every sample of epoch 0 once")

    def test_check_says_what_consumers_auto_was_checked_as(self):
        (self.dir / "p.yaml").write_text(config())
        r = subprocess.run([f"{dt.BIN}/mmfeedd", "--check", str(self.dir / "p.yaml")], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("1 consumer rank(s) of node 0 of 1 as checked: consumers: auto takes the first trainer's job",
                      r.stdout)



class ReshapeTest(JobCase):
    """A job restarted at another shape resumes where it stood (issue #31): every daemon and
    trainer killed halfway through an epoch, the job goes on at another number of nodes and
    ranks from one rank's checkpoint (its cursor carries the job's position), and the union of
    its lives is every sample of the epoch once; the next epoch is what a fresh run of the new
    shape gives."""

    def life(self, name, nodes, per_node, batches=None, resume_from=None, cfg=None, state=None, cursors_of=None):
        """A daemon per node (`consumers: auto`, or `cfg`; with `state`, in STATE-nodeN with
        --state-dir STATE-stateN, as a node service restarted on its own config), `per_node` trainers on each taking `batches` batches (None: to the end) and
        keeping their cursors (--cursor: a copy of `resume_from`, or of each rank's own cursor
        in life `cursors_of`); then the daemons are SIGKILLed (or, at the end of the data,
        exit). Returns the daemons."""
        daemons = []
        for n in range(nodes):
            d = self.dir / f"{state or name}-node{n}"
            d.mkdir(exist_ok=bool(state))
            extra = ("--state-dir", str(self.dir / f"{state}-state{n}")) if state else ()
            daemons.append(dt.Daemon(d, cfg or config().replace("path: manifest.jsonl",
                                                                f"path: {self.dir}/manifest.jsonl"), extra=extra))
        procs = []
        for n in range(nodes):
            for r in range(per_node):
                g = n * per_node + r
                cursor = self.dir / f"{name}-cursor{g}.json"
                if resume_from or cursors_of:
                    shutil.copy(resume_from or self.dir / f"{cursors_of}-cursor{g}.json", cursor)
                args = ["--json", "--dump", str(self.dir / f"{name}-dump{g}"), "--cursor", str(cursor)]
                procs.append(self.consume(daemons[n], torchrun(n, r, nodes, per_node), *args,
                                          *(["--batches", str(batches)] if batches else [])))
        for p in procs:
            dt.finish(p)
        for d in daemons:
            if batches:
                d.proc.kill()
                d.proc.wait()
            else:
                self.assertEqual(d.wait(), 0, d.log())
        return daemons

    def cursors(self, name, ranks):
        return [json.loads((self.dir / f"{name}-cursor{g}.json").read_text()) for g in range(ranks)]

    def delivered(self, name, ranks, epoch):
        return [[i for meta, _ in dt.dumped_batches(self.dir / f"{name}-dump{g}") if meta["epoch"] == epoch
                 for i in meta["ids"]] for g in range(ranks)]

    def fresh_epoch(self, cfg, ranks, epoch):
        """What each rank of a fresh run of `cfg` (auto made explicit: one node of `ranks`
        ranks) gets in `epoch`."""
        fresh = dt.Daemon(self.dir, cfg.replace("consumers: auto", f"consumers: {ranks}")
                          .replace("node_rank: auto, num_nodes: auto", "node_rank: 0, num_nodes: 1"))
        for c in [fresh.consume(r, "--dump", str(self.dir / f"fresh-dump{r}")) for r in range(ranks)]:
            dt.finish(c)
        self.assertEqual(fresh.wait(), 0, fresh.log())
        return self.delivered("fresh", ranks, epoch)

    def test_2x2_then_3x1_then_1x4_deliver_every_sample_of_the_epoch_once(self):
        # Life 1: 2 nodes x 2 ranks, 3 batches of 4 each: positions [0, 48) of epoch 0.
        self.life("a", 2, 2, batches=3)
        cs = self.cursors("a", 4)
        self.assertEqual({(c["epoch"], c["position"], c["order"]) for c in cs}, {(0, 48, cs[0]["order"])}, cs)
        # Life 2: 3 nodes x 1 rank from rank 0's cursor: 48 left, 16 a rank; 2 batches each.
        daemons = self.life("b", 3, 1, batches=2, resume_from=self.dir / "a-cursor0.json")
        self.assertIn("the job resumes there, 4 batch(es) a rank left in epoch 0", daemons[0].log())
        cs = self.cursors("b", 3)
        self.assertEqual({(c["epoch"], c["position"]) for c in cs}, {(0, 72)}, cs)
        # Life 3: 1 node x 4 ranks from life 2's rank 2 to the end: the last 24, 6 a rank.
        self.life("c", 1, 4, resume_from=self.dir / "b-cursor2.json")
        lives = [self.delivered("a", 4, 0), self.delivered("b", 3, 0), self.delivered("c", 4, 0)]
        self.assertEqual([sum(map(len, life)) for life in lives], [48, 24, 24])
        self.assertEqual({len(ids) for ids in lives[2]}, {6}, "equal shares in the resumed part")
        every = sorted(i for life in lives for ids in life for i in ids)
        self.assertEqual(every, [f"s{i:03d}" for i in range(96)], "every sample of epoch 0 once")
        # Epoch 1 is what a fresh run of 1 node x 4 ranks gives, rank by rank.
        self.assertEqual(self.delivered("c", 4, 1), self.fresh_epoch(config(), 4, 1))

    def windows_config(self):
        """The 96 captions as 8 shards of 12, read in windows of 2 shards."""
        dt.text_shards(self.dir, "shard", 8, 12, lambda i: f"s{i:03d}", lambda i: f"caption {i}")
        return config().replace("type: manifest, path: manifest.jsonl",
                                f'type: webdataset, path: "{self.dir}/shard-{{0..7}}.tar", index: on, '
                                'shuffle_window: 2')

    def test_one_node_reading_shard_windows_resumes_at_another_shape(self):
        cfg = self.windows_config()
        # Life 1: 1 node x 2 ranks, 3 batches of 4 each: positions [0, 24) of epoch 0.
        self.life("a", 1, 2, batches=3, cfg=cfg)
        cs = self.cursors("a", 2)
        self.assertEqual({(c["epoch"], c["position"]) for c in cs}, {(0, 24)}, cs)
        # Life 2: 1 node x 3 ranks from rank 1's cursor to the end: 72 left, 24 a rank.
        daemons = self.life("b", 1, 3, resume_from=self.dir / "a-cursor1.json", cfg=cfg)
        self.assertIn("the job resumes there, 6 batch(es) a rank left in epoch 0", daemons[0].log())
        lives = [self.delivered("a", 2, 0), self.delivered("b", 3, 0)]
        self.assertEqual([sum(map(len, life)) for life in lives], [24, 72])
        every = sorted(i for life in lives for ids in life for i in ids)
        self.assertEqual(every, [f"s{i:03d}" for i in range(96)], "every sample of epoch 0 once")
        # Life 1's 24 positions are the epoch's first window: 2 shards.
        self.assertEqual(len({int(i[1:]) // 12 for ids in lives[0] for i in ids}), 2, lives[0])
        # Epoch 1 is what a fresh run of 1 node x 3 ranks gives, rank by rank.
        self.assertEqual(self.delivered("b", 3, 1), self.fresh_epoch(cfg, 3, 1))

    def test_shard_windows_over_several_nodes_resume_at_another_shape(self):
        # Each of 2 nodes reads its own half of the window sequence (its part), so the job's
        # order interleaves the parts and its cursors name the nodes (lanes) they count in.
        cfg = self.windows_config()
        # Life 1: 2 nodes x 2 ranks, 3 batches of 4 each: the first 24 of each node's part.
        self.life("a", 2, 2, batches=3, cfg=cfg)
        cs = self.cursors("a", 4)
        self.assertEqual({(c["epoch"], c["position"], c["lanes"]) for c in cs}, {(0, 48, 2)}, cs)
        shards = [{int(i[1:]) // 12 for ids in self.delivered("a", 4, 0)[2 * n:2 * n + 2] for i in ids}
                  for n in (0, 1)]
        self.assertEqual([len(s) for s in shards], [2, 2], "each node read one window of its own part")
        self.assertFalse(shards[0] & shards[1], shards)
        # Life 2: 3 nodes x 1 rank from rank 3's cursor: 48 left, 16 a rank; 2 batches each,
        # the daemons killed and restarted from --state-dir, which keeps the base's 2 lanes.
        daemons = self.life("b", 3, 1, batches=1, resume_from=self.dir / "a-cursor3.json", cfg=cfg, state="b")
        self.assertIn("the job resumes there, 4 batch(es) a rank left in epoch 0", daemons[0].log())
        self.assertEqual(json.loads((self.dir / "b-state0" / "cursors.json").read_text())["origin"]["base_lanes"], 2)
        self.life("b2", 3, 1, batches=1, cursors_of="b", cfg=cfg, state="b")
        cs = self.cursors("b2", 3)
        self.assertEqual({(c["epoch"], c["position"], c["lanes"]) for c in cs}, {(0, 72, 2)}, cs)
        # Life 3: 1 node x 4 ranks from life 2's rank 1 to the end: the last 24, 6 a rank.
        self.life("c", 1, 4, resume_from=self.dir / "b2-cursor1.json", cfg=cfg)
        lives = [self.delivered(*life, 0) for life in (("a", 4), ("b", 3), ("b2", 3), ("c", 4))]
        self.assertEqual([sum(map(len, life)) for life in lives], [48, 12, 12, 24])
        self.assertEqual({len(ids) for ids in lives[3]}, {6}, "equal shares in the resumed part")
        every = sorted(i for life in lives for ids in life for i in ids)
        self.assertEqual(every, [f"s{i:03d}" for i in range(96)], "every sample of epoch 0 once")
        # Epoch 1 is what a fresh run of 1 node x 4 ranks gives, rank by rank; its cursors
        # count in 1 lane again.
        self.assertEqual(self.delivered("c", 4, 1), self.fresh_epoch(cfg, 4, 1))
        self.assertEqual({(c["epoch"], c["lanes"]) for c in self.cursors("c", 4)}, {(2, 1)})

    def mixture_config(self, captions):
        """The captions (`captions`: the source's type and path; weight 3) and 40 questions
        (weight 1), 96 draws an epoch."""
        with open(self.dir / "qa.jsonl", "w") as f:
            for i in range(40):
                f.write(json.dumps({"id": f"q{i:03d}", "text": f"question {i}"}) + "\n")
        cfg = config().replace(
            "source: {type: manifest, path: manifest.jsonl, shuffle: true, seed: 5, epochs: 2, "
            "node_rank: auto, num_nodes: auto}",
            f"sources:\n  - {{name: captions, {captions}, weight: 3}}\n"
            f"  - {{name: qa, type: manifest, path: {self.dir}/qa.jsonl, weight: 1}}\n"
            "mix: {seed: 5, epochs: 2, samples_per_epoch: 96, node_rank: auto, num_nodes: auto}")
        self.assertIn("sources:", cfg)
        return cfg

    def test_a_mixture_resumes_at_another_shape_in_the_numbering_it_stood_at(self):
        # A mixture's global order interleaves its lanes, so its cursors name the lanes (4) of
        # their position.
        cfg = self.mixture_config(f"type: manifest, path: {self.dir}/manifest.jsonl")
        self.resume_mixture(cfg, {})
        # A mixture's cursor without its lanes (an older client's) is refused, saying why.
        old = json.loads((self.dir / "a-cursor0.json").read_text())
        del old["lanes"]
        (self.dir / "old.json").write_text(json.dumps(old))
        d = dt.Daemon(self.dir / "c-node0", cfg)
        err = self.refused(d, torchrun(0, 0, 1, 1), "--cursor", str(self.dir / "old.json"))
        self.assertIn("cursor (epoch 0, position 48) cannot resume it: the cursor does not name the shape its "
                      "mixture position counts in", err)

    def test_a_mixture_with_a_source_in_shard_windows_resumes_at_another_shape(self):
        # The captions in 8 shards read in windows: that source's draws are numbered node by
        # node, so the cursors name the nodes (2) besides the lanes (4).
        dt.text_shards(self.dir, "shard", 8, 12, lambda i: f"s{i:03d}", lambda i: f"caption {i}")
        cfg = self.mixture_config(f'type: webdataset, path: "{self.dir}/shard-{{0..7}}.tar", index: on, '
                                  'shuffle_window: 2')
        self.resume_mixture(cfg, {"nodes": 2})
        old = json.loads((self.dir / "a-cursor0.json").read_text())
        del old["nodes"]
        (self.dir / "old.json").write_text(json.dumps(old))
        d = dt.Daemon(self.dir / "c-node0", cfg)
        err = self.refused(d, torchrun(0, 0, 1, 1), "--cursor", str(self.dir / "old.json"))
        self.assertIn("the cursor does not name the nodes its mixture position counts in", err)

    def resume_mixture(self, cfg, nodes):
        """2 x 2 ranks, then 3 x 1 (killed, restarted from --state-dir), then 1 x 4 over a
        mixture `cfg`: the epoch's draws of an uninterrupted run, each once. `nodes`: what the
        cursors of the first two lives carry besides their lanes ({} or {"nodes": 2})."""
        self.life("whole", 2, 2, cfg=cfg)  # uninterrupted, for the epoch's draws
        # Life 1: 2 nodes x 2 ranks, 3 batches of 4 each: positions [0, 48) of epoch 0.
        self.life("a", 2, 2, batches=3, cfg=cfg)
        cs = self.cursors("a", 4)
        shape = lambda c: (c["epoch"], c["position"], c["lanes"], c.get("nodes"))  # noqa: E731
        self.assertEqual({shape(c) for c in cs}, {(0, 48, 4, nodes.get("nodes"))}, cs)
        # Life 2: 3 nodes x 1 rank from rank 0's cursor: 48 left, 16 a rank; one batch each,
        # then the daemons are killed and restarted from their --state-dir (which keeps the
        # base and its lanes), the trainers from their own cursors: one more batch each.
        daemons = self.life("b", 3, 1, batches=1, resume_from=self.dir / "a-cursor0.json", cfg=cfg, state="b")
        self.assertIn("the job resumes there, 4 batch(es) a rank left in epoch 0", daemons[0].log())
        origin = json.loads((self.dir / "b-state0" / "cursors.json").read_text())["origin"]
        self.assertEqual((origin["base_lanes"], origin.get("base_nodes")), (4, nodes.get("nodes")))
        daemons = self.life("b2", 3, 1, batches=1, cursors_of="b", cfg=cfg, state="b")
        self.assertIn("continuing from the saved cursors", daemons[0].log())
        cs = self.cursors("b2", 3)
        self.assertEqual({shape(c) for c in cs}, {(0, 72, 4, nodes.get("nodes"))}, cs)
        # Life 3: 1 node x 4 ranks from life 2's rank 2 to the end: the last 24, 6 a rank.
        self.life("c", 1, 4, resume_from=self.dir / "b2-cursor2.json", cfg=cfg)
        lives = [self.delivered(*life, 0) for life in (("a", 4), ("b", 3), ("b2", 3), ("c", 4))]
        self.assertEqual([sum(map(len, life)) for life in lives], [48, 12, 12, 24])
        every = sorted(i for life in lives for ids in life for i in ids)
        whole = sorted(i for ids in self.delivered("whole", 4, 0) for i in ids)
        self.assertEqual(every, whole, "the epoch's draws, each once over the lives")
        self.assertEqual(sum(i.startswith("q") for i in every), 24, "the questions' quarter")
        # Epoch 1 is what a fresh run of 1 node x 4 ranks gives, rank by rank.
        self.assertEqual(self.delivered("c", 4, 1), self.fresh_epoch(cfg, 4, 1))

    def budget_captions(self):
        """Captions of 1..14 bytes: in batches of at most 8 samples and 30 tokens (budget()),
        the batches' sizes vary."""
        with open(self.dir / "budget.jsonl", "w") as f:
            for i in range(96):
                f.write(json.dumps({"id": f"s{i:03d}", "text": "x" * (1 + i * 37 % 14)}) + "\n")
        return f"type: manifest, path: {self.dir}/budget.jsonl"

    def budget(self, cfg):
        self.assertIn("batch_size: 4}", cfg)
        return cfg.replace("batch_size: 4}", "batch_size: 8, max_tokens: 30}")

    def resume_budgeted(self, cfg):
        """2 x 2 ranks, then 3 x 1 (killed, restarted from --state-dir), then 1 x 4 with
        token-budget batches: a step's batches (one per rank) take the next part of the epoch's
        global order (engine/budget.h), so each cursor's position is where the next step
        starts, and the lives together deliver the epoch once."""
        # Life 1: 2 nodes x 2 ranks, 3 batches each.
        self.life("a", 2, 2, batches=3, cfg=cfg)
        cs = self.cursors("a", 4)
        self.assertEqual(len({(c["epoch"], c["position"], c["order"]) for c in cs}), 1, cs)
        first = cs[0]["position"]
        # Life 2: 3 nodes x 1 rank from rank 3's cursor, one batch each; then the daemons are
        # killed and restarted from their --state-dir (which keeps the base), the trainers from
        # their own cursors: one more batch each.
        daemons = self.life("b", 3, 1, batches=1, resume_from=self.dir / "a-cursor3.json", cfg=cfg, state="b")
        self.assertIn(f"epoch 0, position {first} of the job's order (taken at another shape or in another run): "
                      "the job resumes there", daemons[0].log())
        daemons = self.life("b2", 3, 1, batches=1, cursors_of="b", cfg=cfg, state="b")
        self.assertIn("continuing from the saved cursors", daemons[0].log())
        cs = self.cursors("b2", 3)
        self.assertEqual(len({(c["epoch"], c["position"]) for c in cs}), 1, cs)
        second = cs[0]["position"]
        # Life 3: 1 node x 4 ranks from life 2's rank 1 to the end.
        self.life("c", 1, 4, resume_from=self.dir / "b2-cursor1.json", cfg=cfg)
        lives = [self.delivered(*life, 0) for life in (("a", 4), ("b", 3), ("b2", 3), ("c", 4))]
        # Every sample is usable: a life that ended at position p delivered the order's [.., p).
        self.assertEqual([sum(map(len, life)) for life in lives[:3]],
                         [first, sum(map(len, lives[1])), second - first - sum(map(len, lives[1]))])
        self.assertTrue(all(sum(map(len, life)) for life in lives[:3]), lives)
        self.assertTrue(0 < first < second < 96, (first, second))
        batches = [sum(1 for meta, _ in dt.dumped_batches(self.dir / f"c-dump{g}") if meta["epoch"] == 0)
                   for g in range(4)]
        self.assertEqual(len(set(batches)), 1, f"equal batches per rank in the resumed part: {batches}")
        every = sorted(i for life in lives for ids in life for i in ids)
        self.assertEqual(len(every), len(set(every)), "no sample twice")
        # All but fewer than 4 at the end (a last step that cannot give each of 4 ranks a batch).
        self.assertGreater(len(every) + 4, 96, every)
        # Epoch 1 is what a fresh run of 1 node x 4 ranks gives, rank by rank.
        self.assertEqual(self.delivered("c", 4, 1), self.fresh_epoch(cfg, 4, 1))
        return every

    def test_token_budget_batches_resume_at_another_shape_from_the_steps_position(self):
        captions = self.budget_captions()
        self.resume_budgeted(self.budget(config().replace("type: manifest, path: manifest.jsonl", captions)))

    def test_a_token_budget_mixture_resumes_at_another_shape(self):
        every = self.resume_budgeted(self.budget(self.mixture_config(self.budget_captions())))
        self.assertTrue(any(i.startswith("q") for i in every) and any(i.startswith("s") for i in every))

    def test_a_budgeted_rule_is_not_one_a_client_from_before_could_misread(self):
        # An older client computes positions from the batch index under "position"; with a token
        # budget the rule comes as "step_position" only, the positions from the slots.
        cfg = self.budget(config(1, "node_rank: 0, num_nodes: 1").replace(
            "type: manifest, path: manifest.jsonl", self.budget_captions()))
        d = dt.Daemon(self.dir, cfg)
        s, reply, fds = ct.raw_attach(d.socket, 0)
        for fd in fds:
            os.close(fd)
        s.close()
        self.assertTrue(reply["ok"], reply)
        self.assertNotIn("position", reply)
        self.assertEqual((reply["step_position"]["epoch"], reply["step_position"]["base"]), (0, 0))
        d.proc.kill()  # a stop would wait for the rank's batches to be taken
        d.proc.wait()

    def test_a_rank_at_another_position_is_refused_naming_both(self):
        self.life("a", 1, 2, batches=2)  # 1 node x 2 ranks: position 16
        late = json.loads((self.dir / "a-cursor1.json").read_text())
        late["position"] = 24  # as if rank 1 had checkpointed a step later
        (self.dir / "late.json").write_text(json.dumps(late))
        for r in range(3):  # each trainer's own copy of a life-1 checkpoint
            shutil.copy(self.dir / f"a-cursor{min(r, 1)}.json", self.dir / f"r{r}.json")
        d = dt.Daemon(self.dir, config())
        # Resumed as 1 node x 3 ranks: 80 left, 26 a rank (the last 2 wait for epoch 1).
        first = self.consume(d, torchrun(0, 0, 1, 3), "--cursor", str(self.dir / "r0.json"), "--json")
        for _ in range(200):
            status = json.loads(d.ctl("status", "--json").stdout)
            if status["state"] != "waiting for the job":
                break
            time.sleep(0.05)
        self.assertEqual((status["job"]["resumed"]["epoch"], status["job"]["resumed"]["position"]), (0, 16))
        err = self.refused(d, torchrun(0, 1, 1, 3), "--cursor", str(self.dir / "late.json"))
        self.assertIn("the cursor is at epoch 0, position 24 of the job's order, but this daemon resumed the "
                      "job at epoch 0, position 16 (pid", err)
        others = [self.consume(d, torchrun(0, r, 1, 3), "--cursor", str(self.dir / f"r{r}.json"), "--json")
                  for r in (1, 2)]
        outs = [dt.finish(c) for c in (first, *others)]
        self.assertEqual([o["samples"] for o in outs], [26 + 32] * 3, "the rest of epoch 0, then epoch 1")
        self.assertEqual(d.wait(), 0, d.log())

    def test_an_edited_cursor_is_refused_never_served_as_something_else(self):
        """A position past the epoch's end (it once resumed the job into its next epoch: 0
        samples, exit 0) and a position without its stream tag (once read as a same-shape seq:
        samples skipped) are refused, naming the field and the range; the honest cursor then
        resumes the job exactly."""
        self.life("a", 1, 2, batches=2)  # 1 node x 2 ranks: position 16 of 96
        honest = json.loads((self.dir / "a-cursor0.json").read_text())
        d = dt.Daemon(self.dir, config())
        for position in (97, 2100, 10 ** 15):
            (self.dir / "past.json").write_text(json.dumps(dict(honest, position=position)))
            err = self.refused(d, torchrun(0, 0, 1, 3), "--cursor", str(self.dir / "past.json"))
            self.assertIn(f'its "position" {position} is past the end of epoch 0\'s order, which has positions 0 '
                          "to 96: the cursor was edited, or is of other data", err)
        (self.dir / "nostream.json").write_text(json.dumps({k: v for k, v in honest.items() if k != "stream"}))
        err = self.refused(d, torchrun(0, 0, 1, 3), "--cursor", str(self.dir / "nostream.json"))
        self.assertIn('a cursor with "order" and "position" names its "stream" too', err)
        # The daemon still waits for the job, which the honest cursors resume: 80 left, 26 a rank.
        # Each rank its own copy: mmfeed-consume rewrites its --cursor file as it goes, and a
        # rank started after its peer wrote the shared file resumed at the peer's step (CI of
        # b8410e0, ASan: one batch fewer).
        for r in range(3):
            shutil.copy(self.dir / f"a-cursor{min(r, 1)}.json", self.dir / f"b-cursor{r}.json")
        procs = [self.consume(d, torchrun(0, r, 1, 3), "--cursor", str(self.dir / f"b-cursor{r}.json"),
                              "--json", "--dump", str(self.dir / f"b-dump{r}")) for r in range(3)]
        outs = [dt.finish(c) for c in procs]
        self.assertEqual([o["samples"] for o in outs], [26 + 32] * 3, "the rest of epoch 0, then epoch 1")
        self.assertEqual(d.wait(), 0, d.log())
        lives = self.delivered("a", 2, 0) + self.delivered("b", 3, 0)
        every = [i for ids in lives for i in ids]
        self.assertEqual(len(every), 16 + 78)
        self.assertEqual(len(set(every)), len(every), "no sample twice in epoch 0")

    def test_a_saved_origin_past_the_epochs_end_is_refused_at_start(self):
        state = self.dir / "state"
        cfg = config(2, "node_rank: 0, num_nodes: 1")
        d = dt.Daemon(self.dir, cfg, extra=("--state-dir", str(state)))
        for p in [d.consume(r, "--batches", "2") for r in range(2)]:
            dt.finish(p)
        d.proc.kill()
        d.proc.wait()
        saved = json.loads((state / "cursors.json").read_text())
        saved["origin"]["base"] = 2100
        (state / "cursors.json").write_text(json.dumps(saved))
        p = subprocess.run([f"{dt.BIN}/mmfeedd", "--config", str(self.dir / "p.yaml"), "--socket",
                            str(self.dir / "again.sock"), "--state-dir", str(state)],
                           capture_output=True, text=True, timeout=60)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("the origin's base 2100 is not a position this pipeline resumes at: its \"position\" 2100 is "
                      "past the end of epoch 0's order, which has positions 0 to 96", p.stderr)

    def test_an_explicit_shape_says_how_a_cursor_of_another_shape_resumes(self):
        self.life("a", 1, 2, batches=2)
        d = dt.Daemon(self.dir, config(1, "node_rank: 0, num_nodes: 1"))
        err = self.refused(d, {}, "--rank", "0", "--cursor", str(self.dir / "a-cursor0.json"))
        self.assertIn("the cursor is at epoch 0, position 16 of the job's order, taken at another shape or in "
                      "another run: a daemon resumes a job there when it takes the job's shape from its "
                      "trainers (`consumers: auto`)", err)
        d.ctl("stop")
        d.wait()

class ReplicasTest(JobCase):
    """Model-parallel groups (`replicas:`, issue #31): the trainer ranks of a group read one
    stream from one ring and receive byte-identical batches; a member that dies holds its group
    until its successor resumes; a member resuming at another step while its peer reads is
    refused."""

    def batches(self, dump):
        """Per batch: its meta (less the rank) and every tensor's bytes."""
        out = []
        for meta, path in dt.dumped_batches(dump):
            meta.pop("rank", None)
            out.append((meta, {t.name: t.read_bytes() for t in sorted(path.glob("*.npy"))}))
        return out

    def wait_status(self, d, until):
        for _ in range(400):
            status = json.loads(d.ctl("status", "--json").stdout)
            if until(status):
                return status
            time.sleep(0.05)
        raise AssertionError(f"status never got there: {status}\n{d.log()}")

    def test_a_group_reads_one_ring_and_gets_byte_identical_batches(self):
        d = dt.Daemon(self.dir, config("4\nreplicas: 2", "node_rank: 0, num_nodes: 1"))
        self.assertIn("2 ring(s) of 4 slots", d.log())
        self.assertIn("each read by 2 trainer ranks (replicas)", d.log())
        fds = []
        for f in pathlib.Path(f"/proc/{d.proc.pid}/fd").iterdir():
            try:
                fds.append(os.readlink(f))
            except FileNotFoundError:  # a file the daemon's readers closed meanwhile
                pass
        self.assertEqual(sorted({f for f in fds if "mmfeed-ring-" in f and "control" not in f}),
                         ["/memfd:mmfeed-ring-0 (deleted)", "/memfd:mmfeed-ring-1 (deleted)"], "a ring per group")
        cs = [d.consume(r, "--json", "--dump", str(self.dir / f"dump{r}")) for r in range(4)]
        outs = [dt.finish(c) for c in cs]
        self.assertEqual(d.wait(), 0, d.log())
        self.assertEqual([o["samples"] for o in outs], [96] * 4, "two epochs of 48 for each stream")
        for a, b in ((0, 1), (2, 3)):
            self.assertEqual(self.batches(self.dir / f"dump{a}"), self.batches(self.dir / f"dump{b}"))
        self.assertNotEqual(outs[0]["sample_ids_sha256"], outs[2]["sample_ids_sha256"])
        # The two streams are what an explicit 2-consumer config deals, rank by rank.
        ref = self.dir / "ref"
        ref.mkdir()
        r = dt.Daemon(ref, config(2, "node_rank: 0, num_nodes: 1").replace(
            "path: manifest.jsonl", f"path: {self.dir}/manifest.jsonl"))
        refs = [dt.finish(c) for c in [r.consume(k, "--json") for k in (0, 1)]]
        self.assertEqual(r.wait(), 0, r.log())
        self.assertEqual([outs[0]["sample_ids_sha256"], outs[2]["sample_ids_sha256"]],
                         [o["sample_ids_sha256"] for o in refs])

    def test_a_dead_member_holds_its_group_and_its_successor_resumes(self):
        d = dt.Daemon(self.dir, config("2\nreplicas: 2", "node_rank: 0, num_nodes: 1"))
        early, late = self.dir / "early.json", self.dir / "late.json"
        peer = d.consume(0, "--json", "--dump", str(self.dir / "dump0"), "--hold-ms", "5")
        dt.finish(d.consume(1, "--batches", "1", "--cursor", str(early), "--dump", str(self.dir / "a")))
        shutil.copy(early, late)
        died = d.consume(1, "--abort-after", "2", "--cursor", str(late), "--dump", str(self.dir / "b"))
        self.assertEqual(died.wait(30), 3)
        # Rank 0 takes what the ring holds, then waits for rank 1: the group is held.
        status = self.wait_status(d, lambda s: s["consumers"][0]["lag_batches"] == 0 and
                                  s["consumers"][0]["published"] == 6)
        self.assertEqual([(c["rank"], c["stream"], c["attached"]) for c in status["consumers"]],
                         [(0, 0, True), (1, 0, False)])
        self.assertEqual(status["consumers"][1]["lag_batches"], 4, "its own batch 2 again, then 3 to 5")
        table = d.ctl("consumers").stdout
        self.assertRegex(table, r"\n1/0 +- ")
        self.assertIn("rank/stream: replicas 2", table)
        self.assertIn("job: 2 consumer rank(s) in groups of 2 (replicas)", d.ctl("status").stdout)
        self.assertIsNone(peer.poll())
        # Its successor resumes from an earlier checkpoint (batch 1, freed since): the stream is
        # rewound under rank 0, which does not get the batches made again.
        dt.finish(d.consume(1, "--cursor", str(early), "--dump", str(self.dir / "c")))
        dt.finish(peer)
        self.assertEqual(d.wait(), 0, d.log())
        self.assertIn("rank 1: resuming at batch 1 (0 finished batch(es) dropped from the ring, the rank rewound)",
                      d.log())
        seen = self.batches(self.dir / "dump0")
        self.assertEqual([meta["seq"] for meta, _ in seen], list(range(48)), "rank 0: every batch once")
        self.assertEqual(self.batches(self.dir / "a") + self.batches(self.dir / "c"), seen,
                         "rank 1 from its checkpoints: rank 0's batches, byte for byte")

    def test_replicas_at_different_batches_reconnect_to_a_restarted_daemon(self):
        state = self.dir / "state"
        cfg = config("2\nreplicas: 2", "node_rank: 0, num_nodes: 1")
        d = dt.Daemon(self.dir, cfg, extra=("--state-dir", str(state)))
        procs = [d.consume(r, "--reconnect", "30", "--hold-ms", hold, "--json", "--dump", str(self.dir / f"r{r}"))
                 for r, hold in ((0, "1"), (1, "30"))]
        deadline = time.time() + 60
        while time.time() < deadline:  # killed once the state file shows progress
            try:
                if json.loads((state / "cursors.json").read_text())["ranks"][0]["seq"] > 4:
                    break
            except (FileNotFoundError, json.JSONDecodeError, KeyError):
                pass
            time.sleep(0.01)
        d.proc.kill()
        d.proc.wait()
        d2 = dt.Daemon(self.dir, cfg, extra=("--state-dir", str(state)))
        outs = [dt.finish(p, timeout=120) for p in procs]
        self.assertEqual(d2.wait(), 0, d2.log())
        runs = [self.batches(self.dir / f"r{r}") for r in (0, 1)]
        self.assertEqual([meta["seq"] for meta, _ in runs[0]], list(range(48)), "no duplicate batch, no gap")
        self.assertEqual(runs[0], runs[1])
        self.assertEqual([o["batches"] for o in outs], [48, 48])

    def test_a_rank_ahead_of_its_group_waits_and_its_peer_misses_nothing(self):
        # Rank 0's cursor is 6 batches into the stream (a checkpoint of an earlier run of the
        # same config); a fresh daemon has made 4. Rank 0 must not move the stream past what
        # rank 1, starting from the beginning, has not received.
        cfg = config("2\nreplicas: 2", "node_rank: 0, num_nodes: 1")
        ahead = self.dir / "ahead.json"
        first = dt.Daemon(self.dir, cfg)
        cs = [first.consume(r, "--batches", "6", *(["--cursor", str(ahead)] if r == 0 else [])) for r in (0, 1)]
        for c in cs:
            dt.finish(c)
        first.proc.kill()
        first.proc.wait()
        d = dt.Daemon(self.dir, cfg)
        self.wait_status(d, lambda s: s["consumers"][0]["published"] == 4)
        c0 = d.consume(0, "--cursor", str(ahead), "--dump", str(self.dir / "r0"))
        self.wait_status(d, lambda s: s["consumers"][0]["attached"])
        c1 = d.consume(1, "--dump", str(self.dir / "r1"))
        dt.finish(c0)
        dt.finish(c1)
        self.assertEqual(d.wait(), 0, d.log())
        self.assertIn("rank 0: resuming at batch 6 (4 finished batch(es) dropped from the ring, its group's "
                      "stream is behind it: batches before it skipped)", d.log())
        rank1 = self.batches(self.dir / "r1")
        self.assertEqual([meta["seq"] for meta, _ in rank1], list(range(48)), "rank 1: every batch, from the first")
        self.assertEqual(self.batches(self.dir / "r0"), rank1[6:])

    def test_a_reload_that_needs_larger_rings_moves_the_whole_group(self):
        cfg = config("2\nreplicas: 2", "node_rank: 0, num_nodes: 1")
        d = dt.Daemon(self.dir, cfg)
        cs = [d.consume(r, "--json", "--hold-ms", hold, "--dump", str(self.dir / f"r{r}"))
              for r, hold in ((0, "10"), (1, "25"))]
        self.wait_status(d, lambda s: s["consumers"][1]["released"] >= 4)
        (self.dir / "p.yaml").write_text(cfg.replace("max_len: 16", "max_len: 4096"))
        reply = json.loads(d.ctl("reload", "--json").stdout)
        self.assertEqual(reply["rings"], "re-made larger; trainers attach to them by themselves", reply)
        outs = [dt.finish(c) for c in cs]
        self.assertEqual(d.wait(), 0, d.log())
        self.assertIn("moved to a new ring", d.log())
        runs = [self.batches(self.dir / f"r{r}") for r in (0, 1)]
        self.assertEqual([meta["seq"] for meta, _ in runs[0]], list(range(48)), "no duplicate batch, no gap")
        self.assertEqual(runs[0], runs[1], "the old ring drained by both, then the new one, byte for byte")
        self.assertEqual({meta["dtypes"]["text"] for meta, _ in runs[0]}, {runs[0][0][0]["dtypes"]["text"]})
        widths = [len(t["text.npy"]) for _, t in runs[0]]
        self.assertLess(widths[0], widths[-1], "the reload took effect")
        self.assertEqual([o["batches"] for o in outs], [48, 48])

    def test_a_rank_without_a_trainer_is_named_once_its_group_waits(self):
        d = dt.Daemon(self.dir, config("2\nreplicas: 2", "node_rank: 0, num_nodes: 1"))
        first = d.consume(0, "--json")
        for _ in range(400):
            if "have had no trainer" in d.log():
                break
            time.sleep(0.05)
        self.assertIn("rank(s) 1 have had no trainer while rank 0 of the same group (replicas: 2 in", d.log())
        outs = [dt.finish(c) for c in (first, d.consume(1, "--json"))]
        self.assertEqual(outs[0]["sample_ids_sha256"], outs[1]["sample_ids_sha256"])
        self.assertEqual(d.wait(), 0, d.log())

    def test_consumers_auto_groups_the_declared_ranks(self):
        (self.dir / "check.yaml").write_text(config("auto\nreplicas: 2"))
        check = subprocess.run([f"{dt.BIN}/mmfeedd", "--check", str(self.dir / "check.yaml")],
                               capture_output=True, text=True, timeout=60)
        self.assertEqual(check.returncode, 0, check.stderr)
        self.assertIn("2 consumer rank(s) in groups of 2 (replicas), 1 stream(s) of node 0 of 1", check.stdout + check.stderr)
        d = dt.Daemon(self.dir, config("auto\nreplicas: 2"))
        err = self.refused(d, torchrun(0, 0, 1, 3))
        self.assertIn("the job runs 3 trainers a node, not a multiple of replicas: 2", err)
        outs = [dt.finish(c) for c in [self.consume(d, torchrun(0, r, 1, 2), "--json") for r in (0, 1)]]
        self.assertEqual(d.wait(), 0, d.log())
        self.assertEqual({o["sample_ids_sha256"] for o in outs}, {outs[0]["sample_ids_sha256"]})
        self.assertEqual(outs[0]["samples"], 192)

    def test_replicas_auto_takes_the_group_size_the_trainers_declare(self):
        """`replicas: auto`: the tensor-parallel size the trainers declare ($MMFEED_REPLICAS);
        a trainer declaring another is refused naming both, as is one declaring a size a fixed
        `replicas:` does not give."""
        d = dt.Daemon(self.dir, config("auto\nreplicas: auto"))
        tp = lambda r, k="2": {**torchrun(0, r, 1, 4), "MMFEED_REPLICAS": k}
        first = self.consume(d, tp(0), "--json")
        deadline = time.time() + 30
        while "declares it" not in d.log():
            self.assertLess(time.time(), deadline, d.log())
            time.sleep(0.05)
        self.assertIn("1 node(s) x 4 rank(s), this node 0, in groups of 2 (replicas); serving 4 consumer rank(s)",
                      d.log())
        err = self.refused(d, tp(1, "4"))
        self.assertIn("declares groups of 4 ranks receiving the same batches, but this daemon serves replicas: 2 "
                      "(adopted from pid", err)
        job = json.loads(d.ctl("status", "--json").stdout)["job"]
        self.assertEqual((job["consumers"], job["replicas"], job["declared"]["replicas"]), (4, 2, 2))
        outs = [dt.finish(c) for c in [first] + [self.consume(d, tp(r), "--json") for r in (1, 2, 3)]]
        self.assertEqual(d.wait(), 0, d.log())
        ids = [o["sample_ids_sha256"] for o in outs]
        self.assertEqual((ids[0], ids[2]), (ids[1], ids[3]), "each group's two ranks get the same batches")
        self.assertNotEqual(ids[0], ids[2])
        self.assertEqual(outs[0]["samples"] + outs[2]["samples"], 192)

        d = dt.Daemon(self.dir, config("2", "node_rank: 0, num_nodes: 1"))
        err = self.refused(d, {**torchrun(0, 0, 1, 2), "MMFEED_REPLICAS": "2"})
        self.assertIn("declares groups of 2 ranks receiving the same batches, but this daemon serves replicas: 1 (",
                      err)


if __name__ == "__main__":
    dt.main()
