#!/usr/bin/env python3
# Writes tests/data/gpt2_bpe_golden.json: GPT-2 token ids for hand-picked and random strings and
# for tests/data/austen_slice.txt, which bpe_tokenizer_test.cpp compares against.
# Two independent oracles must agree on every string or nothing is written:
#   1. tiktoken (PyPI, OpenAI's Rust BPE) given the committed vocabulary as its rank table;
#   2. a plain Python BPE over vocab.bpe with GPT-2's pattern run by the `regex` module.
# Run: pip install tiktoken regex && python3 tests/unit/text/make_bpe_golden.py [CORPUS.txt]
# (with CORPUS.txt, e.g. data/austen.txt, it also prints the corpus token count for docs/data.md).
import json
import hashlib
import os
import random
import sys

import regex
import tiktoken

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
BPE_DIR = os.path.join(ROOT, "third_party", "gpt2_bpe")
DATA_DIR = os.path.join(ROOT, "tests", "data")
PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def byte_alphabet():
    """GPT-2's reversible map byte -> printable code point, rebuilt from its definition."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + \
        list(range(0xAE, 0xFF + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def load_vocab():
    with open(os.path.join(BPE_DIR, "encoder.json"), encoding="utf-8") as f:
        encoder = json.load(f)
    with open(os.path.join(BPE_DIR, "vocab.bpe"), encoding="utf-8") as f:
        merges = [tuple(line.split()) for line in f.read().split("\n")[1:] if line]
    return encoder, merges


def make_tiktoken(encoder):
    inverse = {v: k for k, v in byte_alphabet().items()}
    ranks = {}
    for token, idx in encoder.items():
        if token == "<|endoftext|>":
            continue
        ranks[bytes(inverse[ch] for ch in token)] = idx
    return tiktoken.Encoding("gpt2_local", pat_str=PATTERN, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": encoder["<|endoftext|>"]})


class PlainBpe:
    """Textbook GPT-2 BPE: repeatedly merge the lowest-ranked adjacent pair."""

    def __init__(self, encoder, merges):
        self.encoder = encoder
        self.ranks = {pair: i for i, pair in enumerate(merges)}
        self.alphabet = byte_alphabet()
        self.rx = regex.compile(PATTERN)

    def word(self, w):
        parts = list(w)
        while len(parts) > 1:
            pairs = [(self.ranks.get((a, b), 1 << 30), i)
                     for i, (a, b) in enumerate(zip(parts, parts[1:]))]
            best = min(pairs)[0]
            if best == 1 << 30:
                break
            a, b = next((parts[i], parts[i + 1]) for r, i in pairs if r == best)
            out, i = [], 0
            while i < len(parts):
                if i + 1 < len(parts) and parts[i] == a and parts[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(parts[i])
                    i += 1
            parts = out
        return [self.encoder[p] for p in parts]

    def encode(self, text):
        ids = []
        for w in self.rx.findall(text):
            ids += self.word("".join(self.alphabet[b] for b in w.encode("utf-8")))
        return ids


HAND_PICKED = [
    "Hello world", "I'm", "don't", "I'M", "we're they've you'll he'd it's 'tis", "'s", "''s'",
    "1234", "12345678901234567890", " 42 ", "3.14159", "x2y3", "½ and ² and ٣",
    "Hello, world!!! ...?", "--a something--", "(\"quoted\")", "_italic_ text", "!!!",
    "a  b", "a   b", "trailing   ", "  leading", "\n\n", "a\n\nb", "tab\there", " \t\n x", "\r\n",
    "line\n  indented", "\u00a0nbsp", "café", "naïve Zoë", "£5 and €10", "日本語のテキスト",
    "Привет, мир", "ελληνικά", "emoji 🙂👍🏽", "e\u0301 combining", "x\u3000y", "",
    " ", "EMMA\n\nBy Jane Austen\n\n\n\n\nVOLUME I", "Mr. Woodhouse's", "ﬁne ligature",
]

FUZZ_ALPHABET = list("abcXYZ019 '\n\t.,!-_\"") + [
    "  ", "'s", "'ll", "é", "ß", "£", "½", "²", "\u00a0", "\u2003", "\u3000", "日", "🙂", "\u0301",
    "Ω", "٣", "\r"]


def main():
    encoder, merges = load_vocab()
    tk, plain = make_tiktoken(encoder), PlainBpe(encoder, merges)
    rng = random.Random(20261122)
    fuzz = ["".join(rng.choice(FUZZ_ALPHABET) for _ in range(rng.randint(1, 24)))
            for _ in range(300)]
    cases = []
    for text in HAND_PICKED + fuzz:
        a, b = tk.encode_ordinary(text), plain.encode(text)
        if a != b:
            sys.exit(f"oracles disagree on {text!r}: tiktoken {a} vs plain {b}")
        cases.append({"text": text, "ids": a})
    assert cases[0]["ids"] == [15496, 995], cases[0]

    with open(os.path.join(DATA_DIR, "austen_slice.txt"), "rb") as f:
        raw = f.read()
    slice_ids = tk.encode_ordinary(raw.decode("utf-8"))
    if slice_ids != plain.encode(raw.decode("utf-8")):
        sys.exit("oracles disagree on austen_slice.txt")
    golden = {
        "generator": f"tests/unit/text/make_bpe_golden.py with tiktoken {tiktoken.__version__} "
                     f"and regex {regex.__version__}",
        "cases": cases,
        "fixture": {"file": "austen_slice.txt", "sha256": hashlib.sha256(raw).hexdigest(),
                    "ids": slice_ids},
    }
    with open(os.path.join(DATA_DIR, "gpt2_bpe_golden.json"), "w", encoding="utf-8") as f:
        json.dump(golden, f, separators=(",", ":"))
        f.write("\n")
    print(f"{len(cases)} cases, fixture {len(slice_ids)} tokens")
    if len(sys.argv) > 1:
        with open(sys.argv[1], encoding="utf-8") as f:
            print(f"{sys.argv[1]}: {len(tk.encode_ordinary(f.read()))} tokens")


if __name__ == "__main__":
    main()
