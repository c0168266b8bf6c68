#!/usr/bin/env python3
"""End to end: the training loop of examples/train_image_text.py (its model, optimizer and
step) fed two ways on the same files, in one run:

  mmfeed       mmfeedd on configs/demo.yaml (one rank) -> mmfeed.torch.MmfeedDataset ->
               DataLoader(batch_size=None) -> mmfeed.torch.to_device
  dataloader   DataLoader(num_workers=2) over the same manifest with torchvision's
               RandomResizedCrop(224), RandomHorizontalFlip, ToTensor, Normalize, batch 32
               (bench/torch_baseline.py), the loader a PyTorch user writes

For each: steps/s over --steps steps after --warmup, the median time a step waited for its
batch (stall) and computed. Both share the machine with the model, as on a training node.

usage: train_loop_bench.py [--build build] [--out bench/out/train_loop] [--steps 60] [--warmup 5]
Prints one JSON object.
"""
import argparse, json, os, pathlib, shutil, statistics, subprocess, sys, tempfile, time

ROOT = pathlib.Path(__file__).resolve().parent.parent
PY = "/usr/bin/python3"


def train(batches, steps, warmup):
    """Runs the example's step on each batch; returns the timings of the steps after warmup."""
    import torch
    import torch.nn.functional as F
    from train_image_text import Model

    torch.manual_seed(0)
    model = Model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    stall, compute = [], []
    it = iter(batches)
    t_ready = time.perf_counter()
    start = None
    for step in range(warmup + steps):
        batch = next(it)
        t_got = time.perf_counter()
        logits = model(*batch)
        loss = F.cross_entropy(logits, torch.arange(logits.shape[0]))
        opt.zero_grad()
        loss.backward()
        opt.step()
        t_done = time.perf_counter()
        if step == warmup:
            start = t_ready
        if step >= warmup:
            stall.append((t_got - t_ready) * 1e3)
            compute.append((t_done - t_got) * 1e3)
        t_ready = time.perf_counter()
    seconds = t_ready - start
    return {"steps_per_s": round(steps / seconds, 2), "samples_per_s": round(steps * 32 / seconds),
            "stall_ms_median": round(statistics.median(stall), 1),
            "compute_ms_median": round(statistics.median(compute), 1),
            "stall_share": round(sum(stall) / (sum(stall) + sum(compute)), 3)}


def run_mmfeed(build, data, steps, warmup):
    import mmfeed.torch
    import torch

    cfg = (ROOT / "configs" / "demo.yaml").read_text().replace("consumers: 2", "consumers: 1")
    cfg = cfg.replace("epochs: 1", "epochs: 0")
    (data / "train.yaml").write_text(cfg)
    # The socket in /tmp: a path in a deep clone may pass the 107 bytes a socket's path can have.
    sock = pathlib.Path(tempfile.mkdtemp(prefix="mmfeed-train-")) / "mmfeed.sock"
    log = open(data / "train-daemon.log", "w")
    d = subprocess.Popen([f"{build}/bin/mmfeedd", "--config", str(data / "train.yaml"), "--socket", str(sock),
                          "--drain-timeout", "1"], stderr=log)
    try:
        while not sock.exists():
            if d.poll() is not None:
                sys.exit(f"mmfeedd exited ({d.returncode}) before it served:\n" + (data / "train-daemon.log").read_text())
            time.sleep(0.01)
        loader = torch.utils.data.DataLoader(mmfeed.torch.MmfeedDataset(socket=str(sock), rank=0), batch_size=None,
                                             num_workers=0)
        batches = ((b["image"], b["text"], b["text_lengths"]) for b in mmfeed.torch.to_device(loader, "cpu"))
        return train(batches, steps, warmup)
    finally:
        d.terminate()
        d.wait()
        shutil.rmtree(sock.parent, ignore_errors=True)


def run_dataloader(data, steps, warmup):
    import torch
    from torch_baseline import ImageText

    ds = ImageText(str(data / "manifest.jsonl"), 1 << 30)
    loader = torch.utils.data.DataLoader(ds, batch_size=32, shuffle=True, num_workers=2, persistent_workers=True)

    def forever():
        while True:
            for img, ids, lengths in loader:
                yield img, ids, lengths

    return train(forever(), steps, warmup)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--out", default=str(ROOT / "bench" / "out" / "train_loop"))
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=5)
    a = ap.parse_args()
    sys.path[:0] = [str(ROOT / "examples"), str(ROOT / "bench"), f"{a.build}/python"]
    data = pathlib.Path(a.out)
    data.mkdir(parents=True, exist_ok=True)
    if not (data / "manifest.jsonl").exists():
        subprocess.run([PY, str(ROOT / "scripts" / "make_dataset.py"), str(data), "--count", "2048"], check=True,
                       stdout=subprocess.DEVNULL)
    import torch
    torch.set_num_threads(1)  # the model gets one core in both runs; the loaders share the rest
    res = {"mmfeed": run_mmfeed(a.build, data, a.steps, a.warmup),
           "dataloader_2_workers": run_dataloader(data, a.steps, a.warmup)}
    res["steps_per_s_ratio"] = round(res["mmfeed"]["steps_per_s"] / res["dataloader_2_workers"]["steps_per_s"], 2)
    print(json.dumps(res))


if __name__ == "__main__":
    sys.exit(main())
