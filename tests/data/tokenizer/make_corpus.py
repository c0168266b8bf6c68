#!/usr/bin/env python3
"""Writes corpus.txt: 6,000 deterministic test lines for the tokenizer (English, Chinese,
Japanese, Korean, Cyrillic, Arabic, Hindi, code, emoji, numbers, whitespace runs, special
tokens, decomposed accents that NFC composes, and invalid UTF-8 bytes).

usage: /usr/bin/python3 tests/data/tokenizer/make_corpus.py
"""
import os, random

HERE = os.path.dirname(os.path.abspath(__file__))
FRAGMENTS = [
    "The quick brown fox jumps over the lazy dog.", "It's a dog's life, isn't it?", "They'RE here, WE'LL see, I'D go.",
    "You've got mail; she'll call; he'd know; I'm sure.", "DON'T SHOUT! Don't shout.", "o'clock rock'n'roll",
    "我们今天去公园散步，天气很好。", "人工智能正在改变世界。", "模型训练需要大量的数据和计算资源！",
    "今日は良い天気ですね。", "カタカナとひらがなと漢字を混ぜた文章です。", "東京タワーに行きました！",
    "안녕하세요, 만나서 반갑습니다.", "Привет, как дела? Всё хорошо!", "مرحبا بالعالم، كيف حالك؟",
    "नमस्ते दुनिया, आप कैसे हैं?", "Ελληνικά γράμματα: αβγδε ΑΒΓΔΕ", "Ça va très bien, merci à vous.",
    "def tokenize(text: str) -> list[int]:", "    return [vocab[t] for t in text.split()]",
    "\tif (x != nullptr && y->z[3] >= 0) { return x; }", "for (int i = 0; i < n; ++i) sum += a[i] * b[i];",
    "SELECT id, name FROM users WHERE age > 30;", "const f = async () => { await fetch('/api'); };",
    "x = {'a': 1, \"b\": [2, 3.5e-7]}  # comment", "<div class=\"row\"><p>Hello</p></div>",
    "😀😃😄 🎉🎊 👍🏽 👨‍👩‍👧‍👦 🇫🇷🇯🇵 ❤️‍🔥", "I ❤ Unicode ☃ ★ ☆ ♫ ∑ ∞ ≠ ≤ √",
    "3.14159 2,718 1e10 -42 +7 0x1F 0b1010 1_000_000", "12345678901234567890", "٠١٢٣٤٥٦٧٨٩ ²³ ½ ¾ Ⅻ ①②",
    "Price: $19.99 (€17,50) — 20% off!!!", "phone: +1-555-0100, date 2026-11-29T14:13:00Z",
    "<|im_start|>system\nYou are helpful.<|im_end|>", "<|im_start|>user<|vision_start|><|image_pad|><|vision_end|>",
    "<|endoftext|>", "text<|endoftext|>more", "<|im_sta rt|> not special", "<|fim_prefix|>code<|fim_suffix|>",
    "<tool_call>{\"name\": \"f\"}</tool_call>", "<think>\nreasoning\n</think>",
    "cafe\u0301 nai\u0308ve A\u030a", "\u00c5ngstr\u00f6m ﬁ ﬀ Ⅸ", "ſ 's 'ſ 'S 'ſ", "K\u212a \u2126 \u00b5",
    "   leading spaces", "trailing spaces   ", "tabs\t\tand\t spaces", "a  b   c    d", "\u00a0nbsp\u00a0\u3000ideo\u3000",
    "\r\r\n mixed\r endings", "  \t  ", "...", "!!!???", "----====", "''''", "'s", "\"quoted\"",
    "e.g. i.e. etc. Mr. Dr.", "hyphen-ated words and snake_case and CamelCase", "URL https://example.com/a?b=c&d=e#f",
]
INVALID = [b"\xff", b"\xfe\xfe", b"\xc3", b"\xe4\xb8", b"\xf0\x9f\x98", b"\xc0\xaf", b"\xed\xa0\x80", b"\x80\x81",
           b"\xf4\x90\x80\x80", b"abc\xe2\x82def", b"\xe0\x80\xaf", b"\xc3\x28"]


def main():
    rng = random.Random(20261129)
    lines = []
    for f in FRAGMENTS:  # every fragment alone first
        lines.append(f.replace("\n", "\\n").encode())
    while len(lines) < 6000:
        parts = []
        for _ in range(rng.randint(1, 6)):
            r = rng.random()
            if r < 0.06:
                parts.append(rng.choice(INVALID))
            elif r < 0.12:
                parts.append((" " * rng.randint(1, 9) + "\t" * rng.randint(0, 2)).encode())
            else:
                f = rng.choice(FRAGMENTS)
                if "\n" in f:  # keep one line per line: newlines become \r or spaces
                    f = f.replace("\n", rng.choice(["\r", " ", ""]))
                parts.append(f.encode())
        sep = rng.choice([b" ", b"", b"  ", b"\t"])
        lines.append(sep.join(parts))
    with open(os.path.join(HERE, "corpus.txt"), "wb") as out:
        out.write(b"\n".join(lines) + b"\n")
    print(f"{len(lines)} lines")


if __name__ == "__main__":
    main()
