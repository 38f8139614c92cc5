#!/usr/bin/env python3
"""tests/tokenizer/make_vocab.py — learns a small GPT-2-style byte-level BPE
vocabulary (vocab.json + merges.txt) from text, with the standard library only,
so tests and the demo need no download.

The 256 byte tokens come first (GPT-2's byte-to-unicode spelling), then one
token per merge, then <|endoftext|>. Merges are learned on words split by an
ASCII approximation of GPT-2's pattern (Python's re has no \\p{L}); any merge
list is valid for the tokenizer, which applies the real pattern.

usage: make_vocab.py OUT_DIR N_MERGES TEXT_FILE_OR_DIR...
"""
import collections
import json
import os
import re
import sys

PATTERN = re.compile(r"'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?\d+| ?[^\s\w]+|\s+(?!\S)|\s+")


def byte_alphabet():
    keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


def read_texts(paths):
    for p in paths:
        if os.path.isdir(p):
            for name in sorted(os.listdir(p)):
                full = os.path.join(p, name)
                if (not name.startswith(".") and not name.endswith((".dat", ".u8"))
                        and os.path.isfile(full) and not os.path.islink(full)):
                    yield open(full, "rb").read().decode("utf-8", "replace")
        else:
            yield open(p, "rb").read().decode("utf-8", "replace")


def pairs_of(w):
    return zip(w, w[1:])


def merge_word(w, best):
    out, i = [], 0
    while i < len(w):
        if i + 1 < len(w) and (w[i], w[i + 1]) == best:
            out.append(w[i] + w[i + 1])
            i += 2
        else:
            out.append(w[i])
            i += 1
    return tuple(out)


def learn(words, n_merges):
    """words: {tuple of symbols: count}. Returns the merges, best first: the
    most frequent pair each time (ties: the larger pair), pair counts kept up to
    date for the words a merge touches only."""
    words = list(words.items())
    pairs = collections.Counter()
    for w, c in words:
        for p in pairs_of(w):
            pairs[p] += c
    merges = []
    for _ in range(n_merges):
        pairs = +pairs  # drop counts that fell to zero
        if not pairs:
            break
        best = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))[0]
        merges.append(best)
        for k, (w, c) in enumerate(words):
            if best[0] not in w or best not in set(pairs_of(w)):
                continue
            for p in pairs_of(w):
                pairs[p] -= c
            w = merge_word(w, best)
            for p in pairs_of(w):
                pairs[p] += c
            words[k] = (w, c)
    return merges


def main():
    out, n_merges, paths = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    alpha = byte_alphabet()
    counts = collections.Counter()
    for text in read_texts(paths):
        counts.update(PATTERN.findall(text))
    words = {tuple(alpha[b] for b in w.encode("utf-8")): c for w, c in counts.items()}
    merges = learn(words, n_merges)
    vocab = {alpha[b]: b for b in range(256)}
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    vocab["<|endoftext|>"] = len(vocab)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    with open(os.path.join(out, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n")
        for a, b in merges:
            f.write(f"{a} {b}\n")
    print(f"{out}: {len(vocab)} tokens, {len(merges)} merges")


if __name__ == "__main__":
    main()
