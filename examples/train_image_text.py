#!/usr/bin/env python3
"""A small image+text training loop fed by mmfeed: a little CNN over the images plus an
EmbeddingBag over the caption bytes, trained to tell matching pairs from shuffled ones. It
checkpoints the model, the optimizer and the loader's position every --every steps; killed and
started again with --resume it continues with exactly the batches an uninterrupted run would
have seen. Each step prints how long it waited for data (stall) and how long it computed.

    mmfeedd --config configs/demo.yaml --socket /tmp/mmfeed.sock &
    PYTHONPATH=build/python /usr/bin/python3 examples/train_image_text.py --socket /tmp/mmfeed.sock --steps 200

The mmfeed part is five lines: the dataset, load_state_dict on resume, the DataLoader (or
to_device), and state_dict in the checkpoint.
"""
import argparse, json, os, time

import torch
import torch.nn.functional as F

import mmfeed.torch


class Model(torch.nn.Module):
    def __init__(self, dim=64):
        super().__init__()
        self.conv = torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 5, stride=4), torch.nn.ReLU(), torch.nn.Conv2d(16, 32, 3, stride=2), torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, dim))
        self.text = torch.nn.EmbeddingBag(256, dim)

    def forward(self, image, text, lengths):
        img = F.normalize(self.conv(image), dim=1)
        mask = torch.arange(text.shape[1])[None, :] < lengths[:, None]
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), mask.sum(1).cumsum(0)[:-1]])
        txt = F.normalize(self.text(text[mask].long(), offsets), dim=1)
        return img @ txt.t() * 10  # similarity logits: the diagonal are the true pairs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", default=None)
    ap.add_argument("--rank", type=int, default=None)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--every", type=int, default=20, help="checkpoint every N steps")
    ap.add_argument("--ckpt", default="train_image_text.ckpt")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()
    torch.manual_seed(0)
    model = Model().to(a.device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ds = mmfeed.torch.MmfeedDataset(socket=a.socket, rank=a.rank)  # 1
    step = 0
    if a.resume and os.path.exists(a.ckpt):
        ck = torch.load(a.ckpt)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        ds.load_state_dict(ck["data"])  # 2
        step = ck["step"]
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=0)  # 3
    t_ready = time.perf_counter()
    for batch in mmfeed.torch.to_device(loader, a.device):  # 4
        t_got = time.perf_counter()
        logits = model(batch["image"], batch["text"], batch["text_lengths"])
        loss = F.cross_entropy(logits, torch.arange(logits.shape[0], device=logits.device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        t_done = time.perf_counter()
        print(json.dumps({"step": step, "seq": batch["seq"], "loss": round(loss.item(), 4),
                          "stall_ms": round((t_got - t_ready) * 1e3, 2), "compute_ms": round((t_done - t_got) * 1e3, 2)}),
              flush=True)
        if step % a.every == 0:
            tmp = a.ckpt + ".tmp"
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "data": ds.state_dict(),  # 5
                        "step": step}, tmp)
            os.replace(tmp, a.ckpt)
        if step >= a.steps:
            break
        t_ready = time.perf_counter()


if __name__ == "__main__":
    main()
