#!/usr/bin/env python3
"""Tokenizer benchmark: single-thread MB/s of mmfeed's BPE tokenizer and of Hugging Face
`tokenizers` (npm @anush008/tokenizers, RAYON_NUM_THREADS=1), Qwen3 tokenizer, on the same
6,000-line test corpus, in one run.   usage: tokenizer_bench.py [--build BUILD]"""
import argparse, gzip, json, os, pathlib, shutil, subprocess, sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "tokenizer"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--out", default=str(ROOT / "bench" / "out" / "tokenizer"))
    a = ap.parse_args()
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if not (out / "node_modules" / "@anush008" / "tokenizers").exists():
        subprocess.run(["npm", "install", "--prefix", str(out), "--no-save", "@anush008/tokenizers@0.6.0"], check=True,
                       stdout=subprocess.DEVNULL)
    tok_json = out / "tokenizer.json"
    tok_json.write_bytes(gzip.decompress((DATA / "qwen3-tokenizer.json.gz").read_bytes()))
    corpus = DATA / "corpus.txt"
    ours = json.loads(subprocess.run([f"{a.build}/bin/mmfeed-bench-tokenizer", "--tokenizer", str(tok_json), "--corpus",
                                      str(corpus)], capture_output=True, text=True, check=True).stdout)
    env = dict(os.environ, RAYON_NUM_THREADS="1", NODE_PATH=str(out / "node_modules"))
    ref = json.loads(subprocess.run(["node", str(ROOT / "bench" / "tokenizer_reference_bench.js"), str(tok_json), str(corpus)],
                                    capture_output=True, text=True, check=True, env=env).stdout)
    res = {"mmfeed_mb_per_s": ours["mb_per_s"], "hf_tokenizers_mb_per_s": ref["mb_per_s"],
           "ratio": ours["mb_per_s"] / ref["mb_per_s"], "corpus_mb": corpus.stat().st_size / 1e6}
    print(json.dumps(res, indent=2))
    print(f"\n| tokenizer, one thread, Qwen3 | MB/s | ratio |\n|---|---|---|\n"
          f"| mmfeed BpeTokenizer | {res['mmfeed_mb_per_s']:.1f} | {res['ratio']:.2f}x |\n"
          f"| Hugging Face tokenizers | {res['hf_tokenizers_mb_per_s']:.1f} | 1.00 |")


if __name__ == "__main__":
    sys.exit(main())
