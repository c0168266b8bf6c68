#!/usr/bin/env python3
"""The image stage against torchvision itself: the real mmfeedd decodes a varied photo set
(odd sizes, both orientations, grayscale, progressive, 4:4:4 / 4:2:2 / 4:2:0) and its uint8
output is compared pixel by pixel with torchvision's transforms on PIL images, the standard
evaluation transform Resize(256) + CenterCrop(224) and RandomResizedCrop's resized_crop for
the box the daemon reports.

usage: image_fidelity_test.py --bin BUILD/bin
"""
import json, pathlib, sys

import numpy as np

import daemon_test
from daemon_test import Daemon, DaemonCase, dumped_batches, finish

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "scripts"))
import make_photos  # noqa: E402

CONFIG = """pipeline: fidelity
source: {{type: manifest, path: manifest.jsonl, shuffle: false, epochs: 1}}
consumers: 1
stages:
  - {{name: image, type: image, field: image, workers: 2,
     params: {{{params}, size: [224, 224], dtype: uint8, layout: HWC}}}}
  - {{name: batch, type: batch, inputs: [image], params: {{batch_size: 8}}}}
on_error: fail
"""
LIMIT = 1.0  # mean absolute difference per photo, in levels of 0-255
# The resampler computes PIL's arithmetic with 16-bit weights where PIL's are 22-bit: a pass
# moves a value by one level where the exact sum falls within a few thousandths of a rounding
# boundary, so on the same decoded pixels (a full-size decode) no value is more than two
# levels off (one per pass) and nearly all are equal.
EXACT_MEAN = 0.02  # mean over the set


class FidelityTest(DaemonCase):
    @classmethod
    def setUpClass(cls):
        global Image, F, T
        try:
            from PIL import Image
            import torchvision.transforms as T
            import torchvision.transforms.functional as F
        except ImportError as e:
            raise AssertionError(f"torchvision and PIL are needed (scripts/setup.sh installs them): {e}")

    def setUp(self):
        super().setUp()
        photos = make_photos.make(self.dir, 60, 240, 620, seed=1)
        photos += make_photos.make(self.dir, 12, 900, 1700, seed=2, prefix="big")
        self.photos = {p["name"]: p for p in photos}
        with open(self.dir / "manifest.jsonl", "w") as m:
            for name in self.photos:
                m.write(json.dumps({"id": name, "image": name}) + "\n")

    def run_daemon(self, params, tag):
        d = Daemon(self.dir, CONFIG.format(params=params))
        finish(d.consume(0, "--json", "--dump", str(self.dir / tag)))
        self.assertEqual(d.wait(), 0, d.log())
        out = {}
        for meta, path in dumped_batches(self.dir / tag):
            images = np.load(path / "image.npy")
            boxes = np.load(path / "image_box.npy") if (path / "image_box.npy").exists() else None
            for k, sid in enumerate(meta["ids"]):
                out[sid] = (images[k], None if boxes is None else boxes[k])
        self.assertEqual(set(out), set(self.photos))
        return out

    def load(self, name):
        return Image.open(self.dir / name).convert("RGB")

    def check(self, got, reference, what, exact=False):
        """Every photo within LIMIT; with `exact`, PIL's arithmetic: no value more than two
        levels off and EXACT_MEAN over the set. Returns {name: difference}."""
        diffs, largest = {}, 0
        for name, (img, box) in got.items():
            ref = np.asarray(reference(name, box), dtype=np.int16)
            self.assertEqual(img.shape, ref.shape, name)
            d = np.abs(img.astype(np.int16) - ref)
            diffs[name] = float(d.mean())
            largest = max(largest, int(d.max()))
            if exact:
                self.assertLessEqual(int(d.max()), 2, f"{name} {self.photos[name]}")
        worst = max(diffs, key=diffs.get)
        mean = float(np.mean(list(diffs.values())))
        print(f"{what}: mean |difference| {mean:.4f}, worst {diffs[worst]:.4f} "
              f"({worst}, {self.photos[worst]}), largest {largest}", file=sys.stderr)
        if exact:
            self.assertLessEqual(mean, EXACT_MEAN, what)
        return diffs

    def test_center_crop_is_torchvisions_evaluation_transform(self):
        evaluation = T.Compose([T.Resize(256), T.CenterCrop(224)])
        reference = lambda name, _: evaluation(self.load(name))
        off = self.run_daemon("crop: center, resize: 256, dct_scaling: off", "off")
        for name, d in self.check(off, reference, "center, dct_scaling off", exact=True).items():
            self.assertLessEqual(d, LIMIT, f"{name} {self.photos[name]}")
        # The default (dct_scaling: auto) keeps the evaluation transform exact.
        auto = self.run_daemon("crop: center, resize: 256", "auto")
        for name in self.photos:
            self.assertTrue(np.array_equal(auto[name][0], off[name][0]), name)
        # dct_scaling: on decodes photos over twice the resize at 1/2 (or less): photos up to
        # that size give the same bytes; the larger ones differ by a bounded amount.
        on = self.run_daemon("crop: center, resize: 256, dct_scaling: on", "on")
        diffs = self.check(on, reference, "center, dct_scaling on")
        for name, p in self.photos.items():
            if min(p["width"], p["height"]) < 512:
                self.assertTrue(np.array_equal(on[name][0], off[name][0]), name)
            self.assertLessEqual(diffs[name], 3.0, f"{name} {p}")

    def test_random_resized_crop_is_torchvisions_for_the_same_box(self):
        got = self.run_daemon("crop: random_resized_crop, flip: 0.5, output_box: true, dct_scaling: off", "rrc")
        flips = 0

        def reference(name, box):
            nonlocal flips
            x, y, w, h, flipped = (int(v) for v in box)
            img = F.resized_crop(self.load(name), y, x, h, w, [224, 224])
            flips += flipped
            return F.hflip(img) if flipped else img

        for name, d in self.check(got, reference, "random_resized_crop, dct_scaling off", exact=True).items():
            self.assertLessEqual(d, LIMIT, f"{name} {self.photos[name]}")
        self.assertTrue(0 < flips < len(got), "some flipped, some not")
        # The default decodes small boxes at 1/2, 1/4 or 1/8 size: measured, and bounded.
        scaled = self.run_daemon("crop: random_resized_crop, flip: 0.5, output_box: true", "rrc_auto")
        for name, (img, box) in scaled.items():
            self.assertTrue(np.array_equal(box, got[name][1]), "the same boxes and flips")
        for name, d in self.check(scaled, reference, "random_resized_crop, dct_scaling auto").items():
            self.assertLessEqual(d, 4.0, f"{name} {self.photos[name]}")


if __name__ == "__main__":
    daemon_test.main()
