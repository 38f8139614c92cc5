#!/usr/bin/env python3
"""tests/tokenizer/compare_hf.py — fsdp's BPE against Hugging Face `tokenizers`,
token for token, from vocab.json + merges.txt and from tokenizer.json.

Trains a small byte-level BPE (about 600 ids) with `tokenizers` on text this
script writes, saves it as GPT-2's vocab.json + merges.txt, and checks that
`fsdp-tokenize --ids` gives exactly the ids `tokenizers` gives on texts
chosen for the regex's corners (contractions, Unicode letters and digits,
runs of spaces and newlines, punctuation, emoji, "<|endoftext|>" with and
without --special), then the round trip through a token file.

usage: compare_hf.py FSDP_TOKENIZE WORKDIR   (run by tests/tokenizer/test_hf.sh
in a virtual environment that has `tokenizers`)
"""
import json
import os
import subprocess
import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from tokenizers.implementations import ByteLevelBPETokenizer

TRAIN = [
    "The quick brown fox jumps over the lazy dog. It's the dog's day, isn't it?\n",
    "We'll see; they've said you'd be there, I'm sure. DON'T SHOUT!\n",
    "Numbers: 12345, 3.14159, 2024-05-20, ½ and ٣ (Arabic three), Ⅻ.\n",
    "Ünïcödé wörds: naïve café, Straße, Ελληνικά, русский, 日本語のテキスト.\n",
    "    indented code()  {\n\treturn x  +  y;\n}\n\n\n",
    "Emoji 🙂🙃 and symbols ©®™ — dashes – and … ellipses.\n",
] * 40

CASES = [
    "Hello world",
    "It's the dog's day, isn't it? We'll see; they've said you'd be there, I'm sure.",
    "'s 't 're 've 'm 'll 'd 'S 'T",
    "   leading spaces and trailing spaces   ",
    "tabs\tand\nnewlines\n\n\nand   \n  mixed   whitespace \t\n",
    "Numbers 12345 3.14159 ½ ٣ Ⅻ 1,000,000",
    "Ünïcödé naïve café Straße Ελληνικά русский 日本語のテキスト",
    "Emoji 🙂🙃👍🏽 symbols ©®™ — – … 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "punctuation!!! ??? ... ;;; :-) <html> </html> a+b=c",
    "text<|endoftext|>more text <|endoftext|> end",
    "x" * 1000 + "dog" * 1000,
    " " * 50 + "word",
    "",
]


def hf_tokenizer(d, special):
    tok = Tokenizer(models.BPE.from_file(os.path.join(d, "vocab.json"),
                                         os.path.join(d, "merges.txt")))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    if special:
        tok.add_special_tokens(["<|endoftext|>"])
    return tok


def fsdp_ids(exe, vocab, path, special):
    args = [exe, "--vocab", vocab, "--ids", path] + (["--special"] if special else [])
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


def main():
    exe, work = sys.argv[1], sys.argv[2]
    vocab = os.path.join(work, "vocab")
    os.makedirs(vocab, exist_ok=True)
    trainer = ByteLevelBPETokenizer()
    trainer.train_from_iterator(TRAIN, vocab_size=600, min_frequency=2,
                                special_tokens=["<|endoftext|>"])
    trainer.save_model(vocab)
    n_vocab = len(json.load(open(os.path.join(vocab, "vocab.json"), encoding="utf-8")))
    n_merges = sum(1 for l in open(os.path.join(vocab, "merges.txt"), encoding="utf-8")
                   if not l.startswith("#version"))
    print(f"vocabulary {n_vocab} ids, {n_merges} merges")
    failures = 0
    # The same vocabulary as Hugging Face's single tokenizer.json.
    single = os.path.join(work, "single")
    os.makedirs(single, exist_ok=True)
    hf_tokenizer(vocab, True).save(os.path.join(single, "tokenizer.json"))
    for special, where in ((False, vocab), (True, vocab), (True, single)):
        hf = hf_tokenizer(vocab, special)
        for i, text in enumerate(CASES):
            path = os.path.join(work, f"case{i}.txt")
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
            if not text:
                continue  # fsdp_text_load refuses empty files: nothing to compare
            want = hf.encode(text).ids
            got = fsdp_ids(exe, where, path, special)
            status = "ok" if got == want else "MISMATCH"
            print(f"{status}: case {i} special={special} {os.path.basename(where)}: "
                  f"{len(text)} chars -> {len(want)} tokens")
            if got != want:
                failures += 1
                k = next((j for j, (a, b) in enumerate(zip(got, want)) if a != b),
                         min(len(got), len(want)))
                print(f"  first difference at token {k}: fsdp {got[k:k+8]} tokenizers {want[k:k+8]}")
    # The whole training text through a token file and back.
    corpus = os.path.join(work, "corpus.txt")
    with open(corpus, "w", encoding="utf-8") as f:
        f.write("".join(TRAIN))
    shard = os.path.join(work, "corpus.bin")
    subprocess.run([exe, "--vocab", vocab, "--no-eot", "--overwrite", "--out", shard, corpus],
                   check=True, capture_output=True)
    back = subprocess.run([exe, "--vocab", vocab, "--decode", shard], check=True,
                          capture_output=True).stdout
    want = hf_tokenizer(vocab, False).encode("".join(TRAIN)).ids
    with open(shard, "rb") as f:
        raw = f.read()
    ids = [int.from_bytes(raw[1024 + 2 * i:1026 + 2 * i], "little")
           for i in range((len(raw) - 1024) // 2)]
    for what, ok in (("token file ids == tokenizers' ids", ids == want),
                     ("decode(token file) == text", back == "".join(TRAIN).encode("utf-8"))):
        print(("ok: " if ok else "MISMATCH: ") + what)
        failures += not ok
    print(f"{failures} mismatches")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
