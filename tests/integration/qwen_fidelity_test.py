#!/usr/bin/env python3
"""Qwen3.5 vision + chat against references, with the real mmfeedd:
- the qwen_vision stage against the numpy + PIL reference of Qwen's image preprocessing
  (tests/reference/qwen_vision_reference.py, written from Hugging Face's
  Qwen2VLImageProcessor): photos of many sizes and aspect ratios (ImageNet-sized, large ones
  that shrink, tiny ones that grow, panoramas, PNG, grayscale, progressive); per image the grid
  must be the reference's exactly and the patch values within a stated tolerance;
- configs/qwen3.5-vl.yaml end to end: every sample's input_ids equal the whole conversation
  tokenized at once (mmfeed-tokenize, whose ids equal Hugging Face tokenizers' on the
  reference corpus), with exactly grid_t*grid_h*grid_w/4 <|image_pad|> tokens, and labels on
  the answer through its <|im_end|> only.
- several images per sample ("images": [...]): each image's patches and grid in order, one
  vision block per image in the ids, and a sample over max_images refused; text-only samples
  ("images": []) with no patches and no vision tokens, alone in a batch too.
- configs/qwen3.5-vl-video.yaml: the qwen_video stage against the PyAV + numpy + PIL
  reference of Qwen3VLVideoProcessor (frame count and indices, smart_resize over all frames,
  the last frame repeated to a whole temporal patch) on videos of several sizes, rates and
  lengths: grids and timestamps exact, patch values within the image tolerance of an exact
  decode; the ids equal the whole conversation with Qwen3VLProcessor's "<t seconds>" blocks
  tokenized at once, labels on the answer only; two videos in one sample and none
  ("videos": []); a one-frame video refused.

usage: qwen_fidelity_test.py --bin BUILD/bin
"""
import json, pathlib, subprocess, sys

import numpy as np

import daemon_test
from daemon_test import Daemon, DaemonCase, dumped_batches, finish

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests" / "reference"))
import make_photos  # noqa: E402
import qwen_vision_reference as ref  # noqa: E402

MIN_PIXELS, MAX_PIXELS = 65536, 262144
CONFIG = """pipeline: qwen-fidelity
source: {{type: manifest, path: manifest.jsonl, shuffle: false, epochs: 1}}
consumers: 1
stages:
  - {{name: pixel_values, type: qwen_vision, field: image, workers: 2,
     params: {{min_pixels: {min}, max_pixels: {max}, {params}}}}}
  - {{name: batch, type: batch, inputs: [pixel_values], params: {{batch_size: 4}}}}
on_error: skip
"""
# Tolerances, in levels of the 0-255 input (the outputs are (v/255 - 0.5)/0.5: one level is
# 2/255). PIL rounds to 8 bits between its horizontal and vertical passes, clipping bicubic's
# overshoot; the stage keeps the intermediate in float and rounds once.
EXACT_DECODE = {"mean": 0.35, "p99": 2.0}
DCT_SCALED = {"mean": 1.0, "p99": 4.0}  # photos decoded at 1/2-1/8 size before the bicubic


class QwenFidelityTest(DaemonCase):
    @classmethod
    def setUpClass(cls):
        global Image
        from PIL import Image

    def setUp(self):
        super().setUp()
        photos = make_photos.make(self.dir, 24, 240, 620, seed=3)
        photos += make_photos.make(self.dir, 8, 900, 1700, seed=4, prefix="big")
        names = [p["name"] for p in photos]
        src = Image.open(self.dir / names[0]).convert("RGB")
        extra = {  # name: (width, height)
            "tiny.jpg": (20, 12), "small.png": (90, 70), "panorama.jpg": (2400, 24),
            "tower.png": (40, 1900), "odd.jpg": (333, 777),
        }
        for name, size in extra.items():
            src.resize(size, Image.BICUBIC).save(self.dir / name, quality=90)
            names.append(name)
        src.resize((2600, 12)).save(self.dir / "refused.jpg")  # aspect ratio 217: refused
        self.names = names
        with open(self.dir / "manifest.jsonl", "w") as m:
            for name in names + ["refused.jpg"]:
                m.write(json.dumps({"id": name, "image": name}) + "\n")

    def run_daemon(self, params, tag):
        d = Daemon(self.dir, CONFIG.format(min=MIN_PIXELS, max=MAX_PIXELS, params=params))
        finish(d.consume(0, "--json", "--dump", str(self.dir / tag)))
        self.assertEqual(d.wait(), 0, d.log())
        out = {}
        for meta, path in dumped_batches(self.dir / tag):
            values, grids = np.load(path / "pixel_values.npy"), np.load(path / "image_grid_thw.npy")
            self.assertEqual(values.shape[0], int(np.prod(grids, axis=1).sum()), "ragged rows")
            at = 0
            for sid, grid in zip(meta["ids"], grids):
                n = int(np.prod(grid))
                out[sid] = (values[at:at + n], tuple(int(g) for g in grid))
                at += n
        self.assertEqual(set(out), set(self.names), "every image but the refused one")
        self.assertIn("aspect ratio 217 is above 200", d.log(), "the refused image is named")
        return out

    def check(self, got, tolerance, what):
        means, p99s = [], []
        for name in self.names:
            rows, grid = got[name]
            want, want_grid = ref.preprocess_image(self.dir / name, MIN_PIXELS, MAX_PIXELS)
            self.assertEqual(grid, want_grid, name)
            self.assertEqual(rows.shape, want.shape, name)
            diff = np.abs(rows.astype(np.float64) - want) * 127.5  # in input levels
            mean, p99 = diff.mean(), np.percentile(diff, 99)
            means.append(mean)
            p99s.append(p99)
            self.assertLessEqual(mean, tolerance["mean"], f"{name}: mean |difference| {mean:.3f} levels")
            self.assertLessEqual(p99, tolerance["p99"], f"{name}: 99th percentile {p99:.3f} levels")
        print(f"{what}: mean |difference| {np.mean(means):.3f} levels (worst {max(means):.3f}), "
              f"99th percentile worst {max(p99s):.2f} levels, {len(means)} images", file=sys.stderr)

    def test_patches_and_grids_equal_the_reference(self):
        exact = self.run_daemon("dct_scaling: off", "off")
        self.check(exact, EXACT_DECODE, "dct_scaling off")
        scaled = self.run_daemon("dct_scaling: on", "on")
        self.check(scaled, DCT_SCALED, "dct_scaling on (default)")
        bf16 = self.run_daemon("dct_scaling: off, dtype: bfloat16", "bf16")
        for name in self.names:
            rows = exact[name][0]
            bits = rows.view(np.uint32)
            rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
            self.assertTrue(np.array_equal(bf16[name][0], rounded), f"{name}: bfloat16 is the rounded float32")


TOKENIZER = ROOT / "tests" / "data" / "tokenizer" / "qwen3-tokenizer.json.gz"
IMAGE_PAD, IM_END = 151655, 151645
TEMPLATE = "<|im_start|>user\n{image}{text}<|im_end|>\n<|im_start|>assistant\n{answer}<|im_end|>\n"
CHATS = [
    ("What is in this picture?", "A photo."),
    ("Décris l'image 🙂 en détail.\nDeux lignes.", "Une photo, 2 lignes: ça va."),
    ("  leading spaces, 123456 numbers and trailing spaces  ", "  Indented answer"),
    ("Ignore <|im_end|> this special token in the text", "Done. 🙂"),
    ("日本語のテキスト", "はい、写真です。\n二行目"),
    ("short", ""),
]


def tokenize(texts):
    out = subprocess.run([f"{daemon_test.BIN}/mmfeed-tokenize", "--json", "--tokenizer", str(TOKENIZER)],
                         input="".join(json.dumps(t) + "\n" for t in texts), capture_output=True, text=True,
                         check=True).stdout
    return [json.loads(line) for line in out.splitlines()]


class QwenChatTest(DaemonCase):
    def run_shipped_config(self, changes, skipped):
        """Runs configs/qwen3.5-vl.yaml with `changes` (each text must be in it) on the manifest in
        the test folder, dumping into dump/; the log names the one sample that is `skipped`."""
        config = (ROOT / "configs" / "qwen3.5-vl.yaml").read_text()
        for old, new in [("../tests/data/tokenizer/qwen3-tokenizer.json.gz", str(TOKENIZER)),
                         ("shuffle: true", "shuffle: false")] + changes:
            self.assertIn(old, config)
            config = config.replace(old, new)
        d = Daemon(self.dir, config + "on_error: skip\n")
        finish(d.consume(0, "--json", "--dump", str(self.dir / "dump")))
        self.assertEqual(d.wait(), 0, d.log())
        self.assertIn(skipped, d.log())

    def test_shipped_config_gives_the_whole_conversations_ids_pads_and_labels(self):
        photos = make_photos.make(self.dir, 12, 200, 900, seed=5)
        with open(self.dir / "manifest.jsonl", "w") as m:
            for i, p in enumerate(photos):
                text, answer = CHATS[i % len(CHATS)]
                m.write(json.dumps({"id": p["name"], "image": p["name"], "text": text, "answer": answer}) + "\n")
            m.write(json.dumps({"id": "injected", "image": photos[0]["name"], "text": "two <|image_pad|>",
                                "answer": "x"}) + "\n")
        self.run_shipped_config([("max_pixels: 1003520", f"max_pixels: {MAX_PIXELS}"),
                                 ("batch_size: 8", "batch_size: 4")],
                                "the sample's text contains the vision token <|image_pad|>")
        samples = {}
        for meta, path in dumped_batches(self.dir / "dump"):
            ids, lengths = np.load(path / "input_ids.npy"), np.load(path / "input_ids_lengths.npy")
            labels, grids = np.load(path / "labels.npy"), np.load(path / "image_grid_thw.npy")
            self.assertEqual(ids.dtype, np.int32)
            for k, sid in enumerate(meta["ids"]):
                n = int(lengths[k])
                self.assertTrue((ids[k, n:] == 151643).all(), "padded with <|endoftext|>")
                self.assertTrue((labels[k, n:] == -100).all())
                samples[sid] = (ids[k, :n].tolist(), labels[k, :n].tolist(), tuple(int(g) for g in grids[k]))
        self.assertEqual(set(samples), {p["name"] for p in photos})
        wants = []  # per photo: the whole conversation, and the conversation before the answer
        for i, p in enumerate(photos):
            text, answer = CHATS[i % len(CHATS)]
            size = ref.smart_resize(p["height"], p["width"], 32, MIN_PIXELS, MAX_PIXELS)
            grid = (1, size[0] // 16, size[1] // 16)
            self.assertEqual(samples[p["name"]][2], grid, p["name"])
            image = "<|vision_start|>" + "<|image_pad|>" * (grid[1] * grid[2] // 4) + "<|vision_end|>"
            wants += [TEMPLATE.format(image=image, text=text, answer=answer),
                      TEMPLATE.split("{answer}")[0].format(image=image, text=text)]
        wants = tokenize(wants)
        for i, p in enumerate(photos):
            ids, labels, grid = samples[p["name"]]
            want, before = wants[2 * i], wants[2 * i + 1]
            self.assertEqual(ids.count(IMAGE_PAD), grid[0] * grid[1] * grid[2] // 4, p["name"])
            self.assertEqual(ids, want, f"{p['name']}: {CHATS[i % len(CHATS)]}")
            self.assertEqual(want[:len(before)], before, "the answer starts on a token boundary")
            end = want.index(IM_END, len(before)) + 1
            want_labels = [-100] * len(before) + want[len(before):end] + [-100] * (len(want) - end)
            self.assertEqual(labels, want_labels, f"{p['name']}: labels on the answer and its <|im_end|> only")

    def test_several_images_per_sample_in_order(self):
        photos = make_photos.make(self.dir, 6, 200, 700, seed=6)
        names = [p["name"] for p in photos]
        # 1, 2, 3 and 1 images, then two text-only samples ("images": []): a batch of no images
        lists = [names[0:1], names[1:3], names[3:6], names[2:3], [], []]
        with open(self.dir / "manifest.jsonl", "w") as m:
            for i, images in enumerate(lists):
                m.write(json.dumps({"id": f"s{i}", "images": images, "text": f"Compare {len(images)}.",
                                    "answer": "Same."}) + "\n")
            m.write(json.dumps({"id": "four", "images": names[0:4], "text": "x", "answer": "y"}) + "\n")
        self.run_shipped_config([("max_pixels: 1003520", f"max_pixels: {MAX_PIXELS}, max_images: 3"),
                                 ("field: image,", "field: images,"), ("batch_size: 8", "batch_size: 2")],
                                "4 images, above max_images 3")
        samples = {}
        for meta, path in dumped_batches(self.dir / "dump"):
            values, grids = np.load(path / "pixel_values.npy"), np.load(path / "image_grid_thw.npy")
            counts = np.load(path / "image_grid_thw_count.npy")
            ids, lengths = np.load(path / "input_ids.npy"), np.load(path / "input_ids_lengths.npy")
            self.assertEqual(grids.shape, (int(counts.sum()), 3), "one grid row per image of the batch")
            self.assertEqual(values.shape[0], int(np.prod(grids, axis=1).sum()))
            cu = np.load(path / "image_cu_seqlens.npy")
            self.assertEqual(cu.tolist(), [0] + np.cumsum(np.prod(grids, axis=1)).tolist(), "each image's start")
            g = at = 0
            for k, sid in enumerate(meta["ids"]):
                images = []
                for grid in grids[g:g + counts[k]]:
                    n = int(np.prod(grid))
                    images.append((values[at:at + n], tuple(int(v) for v in grid)))
                    at += n
                g += counts[k]
                samples[sid] = (images, ids[k, :lengths[k]].tolist())
        self.assertEqual(set(samples), {f"s{i}" for i in range(len(lists))})
        wants = []
        for i, images in enumerate(lists):
            got, _ = samples[f"s{i}"]
            self.assertEqual(len(got), len(images))
            blocks = ""
            for (rows, grid), name in zip(got, images):
                want, want_grid = ref.preprocess_image(self.dir / name, MIN_PIXELS, MAX_PIXELS)
                self.assertEqual(grid, want_grid, name)
                self.assertLessEqual(np.abs(rows.astype(np.float64) - want).mean() * 127.5, DCT_SCALED["mean"], name)
                blocks += "<|vision_start|>" + "<|image_pad|>" * (grid[1] * grid[2] // 4) + "<|vision_end|>"
            wants.append(TEMPLATE.format(image=blocks, text=f"Compare {len(images)}.", answer="Same."))
        for i, want in enumerate(tokenize(wants)):
            self.assertEqual(samples[f"s{i}"][1], want, f"s{i}: every image's block, in order")

VIDEO_PAD = 151656
VIDEO_TEMPLATE = TEMPLATE.replace("{image}", "{video}")
VIDEOS = {  # name: ffmpeg's input and encoding
    "vga.mp4": "testsrc2=size=320x240:rate=25 -t 6 -c:v libx264 -g 25 -bf 3",
    "ntsc720p.mp4": "testsrc2=size=1280x720:rate=30000/1001 -t 5 -c:v libx264 -preset ultrafast -g 30",
    "portrait.mp4": "testsrc2=size=240x426:rate=24 -t 2.2 -c:v libx264",
    "three.mp4": "testsrc2=size=200x150:rate=25 -frames:v 3 -c:v libx264",
    "sixty.mp4": "testsrc2=size=352x288:rate=60 -t 2 -c:v libx264 -bf 2",
    "long.mp4": "testsrc2=size=192x108:rate=10 -t 40 -c:v libx264 -g 20",
    "banner.mp4": "testsrc2=size=640x160:rate=25 -t 3 -c:v mpeg4 -q:v 3",
    "one.mp4": "testsrc2=size=320x240:rate=25 -frames:v 1 -c:v libx264",  # refused
}


class QwenVideoTest(DaemonCase):
    def test_shipped_video_config_gives_the_references_patches_times_and_ids(self):
        for name, spec in VIDEOS.items():
            subprocess.run(f"ffmpeg -v error -y -f lavfi -i {spec} -pix_fmt yuv420p {self.dir / name}",
                           shell=True, check=True)
        # Each video alone, two videos in one sample, and a sample without video ("videos": []).
        lists = {name: [name] for name in VIDEOS}
        lists.update({"pair": ["sixty.mp4", "vga.mp4"], "none": []})
        with open(self.dir / "manifest.jsonl", "w") as m:
            for i, (sid, videos) in enumerate(lists.items()):
                text, answer = CHATS[i % len(CHATS)]
                m.write(json.dumps({"id": sid, "videos": videos, "text": text, "answer": answer}) + "\n")
        config = (ROOT / "configs" / "qwen3.5-vl-video.yaml").read_text()
        for old, new in [("../tests/data/tokenizer/qwen3-tokenizer.json.gz", str(TOKENIZER)),
                         ("shuffle: true", "shuffle: false"), ("batch_size: 4", "batch_size: 3"),
                         ("field: video,", "field: videos,"), ("max_frames: 768,", "max_frames: 768, max_videos: 2,")]:
            self.assertIn(old, config)
            config = config.replace(old, new)
        d = Daemon(self.dir, config + "on_error: skip\n")
        finish(d.consume(0, "--json", "--dump", str(self.dir / "dump")), timeout=240)
        self.assertEqual(d.wait(), 0, d.log())
        self.assertIn("1 frame(s) sampled", d.log(), "the one-frame video is refused, by name")
        # The profile's line for the stage: the sampler's counters (each file indexed once).
        self.assertRegex(d.log(), r"pixel_values_videos: decoded_per_sampled [0-9.]+, index_hits [0-9]+, "
                                  r"index_misses 8, seeks_per_video")
        samples = {}
        for meta, path in dumped_batches(self.dir / "dump"):
            values, grids = np.load(path / "pixel_values_videos.npy"), np.load(path / "video_grid_thw.npy")
            counts, seconds = np.load(path / "video_grid_thw_count.npy"), np.load(path / "video_grid_thw_seconds.npy")
            ids, lengths = np.load(path / "input_ids.npy"), np.load(path / "input_ids_lengths.npy")
            labels = np.load(path / "labels.npy")
            self.assertEqual(grids.shape, (int(counts.sum()), 3), "a grid row per video of the batch")
            self.assertEqual(values.shape[0], int(np.prod(grids, axis=1).sum()), "ragged rows")
            cu = np.load(path / "video_cu_seqlens.npy")
            frames = np.repeat(grids[:, 1] * grids[:, 2], grids[:, 0])  # as the vision encoder computes it
            self.assertEqual(cu.tolist(), [0] + np.cumsum(frames).tolist(), "each temporal patch's start")
            self.assertTrue(int(lengths.sum()) <= 16384, "within the token budget")
            at = g = 0
            for k, sid in enumerate(meta["ids"]):
                videos = []
                for v in range(counts[k]):
                    n, grid = int(np.prod(grids[g])), tuple(int(x) for x in grids[g])
                    videos.append((values[at:at + n], grid, seconds[k, v, :grid[0]].tolist()))
                    at += n
                    g += 1
                samples[sid] = (videos, ids[k, :lengths[k]].tolist(), labels[k, :lengths[k]].tolist())
        self.assertEqual(set(samples), set(lists) - {"one.mp4"})
        means, p99s, convs = [], [], []
        for i, (sid, names) in enumerate(lists.items()):
            if sid not in samples:
                continue
            videos, _, _ = samples[sid]
            self.assertEqual(len(videos), len(names), sid)
            text = ""
            for (rows, grid, seconds), name in zip(videos, names):
                want, want_grid, want_seconds = ref.preprocess_video(self.dir / name)
                self.assertEqual(grid, want_grid, name)
                self.assertEqual([f"{t:.1f}" for t in seconds], [f"{t:.1f}" for t in want_seconds], name)
                diff = np.abs(rows.astype(np.float64) - want) * 127.5
                means.append(diff.mean())
                p99s.append(np.percentile(diff, 99))
                self.assertLessEqual(means[-1], EXACT_DECODE["mean"], f"{name}: mean |difference| {means[-1]:.3f}")
                self.assertLessEqual(p99s[-1], EXACT_DECODE["p99"], f"{name}: 99th percentile {p99s[-1]:.3f}")
                # Qwen3VLProcessor's expansion of <|vision_start|><|video_pad|><|vision_end|>
                block = "<|video_pad|>" * (grid[1] * grid[2] // 4)
                text += "".join(f"<{t:.1f} seconds><|vision_start|>{block}<|vision_end|>" for t in want_seconds)
            question, answer = CHATS[i % len(CHATS)]
            convs += [VIDEO_TEMPLATE.format(video=text, text=question, answer=answer),
                      VIDEO_TEMPLATE.split("{answer}")[0].format(video=text, text=question)]
        print(f"qwen_video: mean |difference| {np.mean(means):.3f} levels (worst {max(means):.3f}), "
              f"99th percentile worst {max(p99s):.2f} levels, {len(means)} videos", file=sys.stderr)
        convs = tokenize(convs)
        for k, sid in enumerate(s for s in lists if s in samples):
            videos, ids, labels = samples[sid]
            want, before = convs[2 * k], convs[2 * k + 1]
            self.assertEqual(ids.count(VIDEO_PAD), sum(g[0] * g[1] * g[2] // 4 for _, g, _ in videos), sid)
            self.assertEqual(ids, want, sid)
            end = want.index(IM_END, len(before)) + 1
            self.assertEqual(labels, [-100] * len(before) + want[len(before):end] + [-100] * (len(want) - end), sid)


if __name__ == "__main__":
    daemon_test.main()
