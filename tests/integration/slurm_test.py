#!/usr/bin/env python3
"""Elastic jobs under a real Slurm (issue #31): Debian's slurmctld and two slurmd, each
simulated node in its own network and UTS namespace (node0 at 10.214.0.2, node1 at 10.214.1.2,
the controller's namespace routing between them), munge on a socket of the test's own. The job
is the sbatch script of docs/guide/trainers.md: one mmfeedd per node (srun --ntasks-per-node=1) with
`consumers: auto` and `node_rank`/`num_nodes: auto`, then two trainers per node
(mmfeed-consume without --rank, reading Slurm's variables). Each daemon adopts its node's share
of the job, and the four trainers together get every sample once an epoch.

Skipped, saying why, without root or without Slurm and munge (apt-get install slurmd
slurmctld slurm-client munge).

usage: slurm_test.py --bin BUILD/bin
"""
import collections, json, os, pathlib, shutil, signal, subprocess, sys, time, unittest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import daemon_test as dt  # noqa: E402

NODES = 2
SLURM_CONF = """ClusterName=mmfeedtest
SlurmctldHost=ctl(10.214.0.1)
AuthType=auth/munge
AuthInfo=socket={d}/munge.socket
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool-%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
{nodes}
PartitionName=debug Nodes={names} Default=YES MaxTime=INFINITE State=UP
"""


def run(*args, **kw):
    return subprocess.run(args, check=True, capture_output=True, text=True, timeout=60, **kw)


class SlurmTest(dt.DaemonCase):
    def setUp(self):
        super().setUp()
        if os.geteuid() != 0:
            self.skipTest("a simulated Slurm cluster needs root (network namespaces, the daemons as root)")
        tools = ["slurmctld", "slurmd", "sbatch", "sinfo", "scancel", "munged", "ip", "nsenter", "unshare"]
        missing = [t for t in tools if not shutil.which(t, path="/usr/sbin:/usr/bin:/sbin:/bin")]
        if missing or not os.path.exists("/etc/munge/munge.key"):
            self.skipTest(f"needs Slurm and munge (missing: {', '.join(missing) or '/etc/munge/munge.key'}; "
                          "apt-get install slurmd slurmctld slurm-client munge)")
        d = self.dir
        self.tag = f"mms{os.getpid() % 10000}"
        self.ns = [f"{self.tag}c"] + [f"{self.tag}n{k}" for k in range(NODES)]
        self.procs = []
        self.addCleanup(self.teardown_cluster)
        (d / "state").mkdir()
        for k in range(NODES):
            (d / f"spool-node{k}").mkdir()
        self.env = {**os.environ, "SLURM_CONF": str(d / "slurm.conf")}
        try:
            for ns in self.ns:
                run("ip", "netns", "add", ns)
                run("ip", "-n", ns, "link", "set", "lo", "up")
            for k in range(NODES):
                a, b = f"{self.tag}a{k}", f"{self.tag}b{k}"
                run("ip", "link", "add", a, "netns", self.ns[0], "type", "veth", "peer", "name", b, "netns",
                    self.ns[1 + k])
                run("ip", "-n", self.ns[0], "addr", "add", f"10.214.{k}.1/24", "dev", a)
                run("ip", "-n", self.ns[1 + k], "addr", "add", f"10.214.{k}.2/24", "dev", b)
                run("ip", "-n", self.ns[0], "link", "set", a, "up")
                run("ip", "-n", self.ns[1 + k], "link", "set", b, "up")
                run("ip", "-n", self.ns[1 + k], "route", "add", "default", "via", f"10.214.{k}.1")
            run("ip", "netns", "exec", self.ns[0], "sysctl", "-qw", "net.ipv4.ip_forward=1")
        except (OSError, subprocess.CalledProcessError) as e:
            self.skipTest(f"cannot make network namespaces here ({e})")
        nodes = "\n".join(f"NodeName=node{k} NodeAddr=10.214.{k}.2 CPUs=2 RealMemory=1000 State=UNKNOWN"
                          for k in range(NODES))
        (d / "slurm.conf").write_text(SLURM_CONF.format(d=d, nodes=nodes,
                                                        names=",".join(f"node{k}" for k in range(NODES))))
        # munged as root (-f) on the test's own socket; the package's key.
        self.procs.append(subprocess.Popen(
            ["munged", "--foreground", "-f", f"--socket={d}/munge.socket", "--key-file=/etc/munge/munge.key",
             f"--pid-file={d}/munged.pid", f"--log-file={d}/munged.log", f"--seed-file={d}/munge.seed"]))
        deadline = time.time() + 20
        while not (d / "munge.socket").exists():
            self.assertLess(time.time(), deadline, "munged did not start")
            time.sleep(0.05)
        # nsenter --net keeps the host's /sys (slurmd reads its cgroups); unshare --uts gives each
        # daemon the host name Slurm knows it by.
        self.start(self.ns[0], "ctl", "slurmctld", "-D")
        for k in range(NODES):
            self.start(self.ns[1 + k], f"node{k}", "slurmd", "-D")
        deadline = time.time() + 60
        while True:
            out = self.in_ns(self.ns[1], "node0", "sinfo", "-h", "-o", "%T %D").stdout.split()
            if out[:2] == ["idle", str(NODES)]:
                break
            if time.time() > deadline:
                self.fail(f"the simulated cluster did not come up: sinfo says {out}\n" + self.logs())
            time.sleep(0.2)

    def start(self, ns, host, *cmd):
        with open(self.dir / f"{host}.out", "w") as log:
            self.procs.append(subprocess.Popen(["nsenter", f"--net=/run/netns/{ns}", "unshare", "--uts", "sh",
                                                "-c", f"hostname {host}; exec \"$@\"", "sh", *cmd], env=self.env,
                                               stdout=log, stderr=log))

    def in_ns(self, ns, host, *cmd, timeout=60):
        return subprocess.run(["nsenter", f"--net=/run/netns/{ns}", "unshare", "--uts", "sh", "-c",
                               f"hostname {host}; exec \"$@\"", "sh", *cmd], env=self.env, capture_output=True,
                              text=True, timeout=timeout)

    def logs(self):
        return "".join(f"\n--- {p.name}:\n{p.read_text()[-2000:]}" for p in sorted(self.dir.glob("*.log"))
                       if p.is_file())

    def teardown_cluster(self):
        # Jobs first, while the controller can end them; then everything in the namespaces
        # (slurmstepd outlives its slurmd, and the tasks it runs with it).
        if self.procs:
            self.in_ns(self.ns[1], "node0", "scancel", "--full", "--partition=debug", timeout=30)
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        self.procs = []
        for ns in getattr(self, "ns", []):
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=30)
            for pid in pids.stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        self.ns = []

    def tearDown(self):  # the cluster first: the folder it runs in goes next
        self.teardown_cluster()
        super().tearDown()

    def test_an_sbatch_job_starts_a_daemon_per_node_that_adopts_the_jobs_shape(self):
        d, b = self.dir, dt.BIN
        with open(d / "manifest.jsonl", "w") as f:
            for i in range(96):
                f.write(json.dumps({"id": f"s{i:03d}", "text": f"caption {i}"}) + "\n")
        (d / "p.yaml").write_text("""pipeline: slurm
source: {type: manifest, path: manifest.jsonl, shuffle: true, seed: 5, epochs: 2, node_rank: auto, num_nodes: auto}
consumers: auto
stages:
  - {name: text, type: text, field: text, params: {tokenizer: bytes, max_len: 16}}
  - {name: batch, type: batch, inputs: [text], params: {batch_size: 4}}
""")
        # docs/guide/trainers.md's script; every simulated node shares /tmp, so sockets are named per node.
        # --time bounds a job that hangs: the test then fails with the logs, not ctest's timeout.
        (d / "job.sbatch").write_text(f"""#!/bin/bash
#SBATCH --nodes={NODES} --ntasks-per-node=2 --time=2 --output={d}/job.out
srun --ntasks-per-node=1 --ntasks=$SLURM_NNODES --overlap \\
  sh -c 'exec {b}/mmfeedd --config {d}/p.yaml --socket {d}/$SLURMD_NODENAME.sock' 2> {d}/daemons.log &
srun --ntasks-per-node=2 --overlap sh -c \\
  'exec {b}/mmfeed-consume --socket {d}/$SLURMD_NODENAME.sock --reconnect 60 --json --dump {d}/dump$SLURM_PROCID'
""")
        try:
            r = self.in_ns(self.ns[1], "node0", "sbatch", "--wait", str(d / "job.sbatch"), timeout=200)
            said = r.stdout + r.stderr
        except subprocess.TimeoutExpired as e:
            r, said = None, f"sbatch --wait still waiting after {e.timeout} s\n"
        job_out = (d / "job.out").read_text() if (d / "job.out").exists() else ""
        self.assertEqual(r and r.returncode, 0, said + job_out + self.logs())
        daemons = (d / "daemons.log").read_text()
        # One daemon per node: srun takes the job's task count unless --ntasks says otherwise,
        # and a second daemon on a node would serve its socket once the first has ended.
        self.assertEqual(daemons.count("the job's shape comes from the first trainer"), NODES, daemons)
        self.assertNotIn("another mmfeedd", daemons)
        for k in range(NODES):
            self.assertIn(f"(slurm) declares it: {NODES} node(s) x 2 rank(s), this node {k}; serving 2 consumer "
                          f"rank(s) as node {k} of {NODES}", daemons)
        outs = [json.loads(line) for line in job_out.splitlines() if line.startswith("{")]
        self.assertEqual(len(outs), 2 * NODES, job_out)
        by_epoch = collections.defaultdict(list)
        for rank in range(2 * NODES):
            for meta, _ in dt.dumped_batches(d / f"dump{rank}"):
                by_epoch[meta["epoch"]] += meta["ids"]
        self.assertEqual(sorted(by_epoch), [0, 1])
        for epoch, ids in by_epoch.items():
            self.assertEqual(sorted(ids), [f"s{i:03d}" for i in range(96)], f"epoch {epoch}: every sample once")


if __name__ == "__main__":
    dt.main()
