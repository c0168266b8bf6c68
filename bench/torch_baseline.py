#!/usr/bin/env python3
"""The baseline a user would pick instead of mmfeed: PyTorch DataLoader(num_workers=2) with
torchvision RandomResizedCrop(224), RandomHorizontalFlip, ToTensor, Normalize, batch 32, over
the same manifest. Prints {"samples":..,"seconds":..} for `--samples` samples (time from the
DataLoader's creation to the last batch, start-up included: the caller subtracts runs)."""
import argparse, json, os, time

import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset
from torchvision import transforms


class ImageText(Dataset):
    def __init__(self, manifest, limit):
        root = os.path.dirname(os.path.abspath(manifest))
        with open(manifest) as f:
            lines = [json.loads(l) for l in f]
        self.items = [(os.path.join(root, l["image"]), l["text"]) for l in lines][:limit]
        self.tf = transforms.Compose([
            transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(), transforms.ToTensor(),
            transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        path, text = self.items[i]
        img = self.tf(Image.open(path).convert("RGB"))
        ids = torch.zeros(128, dtype=torch.int32)
        b = text.encode()[:128]
        ids[:len(b)] = torch.tensor(list(b), dtype=torch.int32)
        return img, ids, len(b)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("manifest")
    ap.add_argument("--samples", type=int, required=True)
    a = ap.parse_args()
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    loader = DataLoader(ImageText(a.manifest, a.samples), batch_size=32, shuffle=True, num_workers=2)
    n = 0
    for img, ids, lengths in loader:
        n += img.shape[0]
    print(json.dumps({"samples": n, "seconds": time.perf_counter() - t0}))


if __name__ == "__main__":
    main()
