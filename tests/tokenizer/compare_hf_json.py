#!/usr/bin/env python3
"""tests/tokenizer/compare_hf_json.py — fsdp-tokenize reading Hugging Face
tokenizer.json files of the byte-level BPE kind, against `tokenizers`, token
for token.

Builds five vocabularies with `tokenizers`, trained on a few KB of mixed-script
text (English from Debian's fortunes when installed, else the sentences
below; Greek, Cyrillic, CJK, digits, emoji, contractions, accents written
decomposed):
  gpt2    ByteLevel alone (GPT-2's regex), <|endoftext|>; checked with the
          merges saved as [a, b] pairs and rewritten as "a b" strings;
  llama3  Split on Llama 3's regex (\\p{L}, \\p{N}, (?i:'s|...), 1-3 digit
          groups) then ByteLevel without its regex, ignore_merges (with whole
          words added to model.vocab that the merges do not make), special
          tokens after the vocabulary (<|begin_of_text|>, ..., and prefixes of
          them: the longest match wins) and one non-special added token,
          <|begin_of_text|> put first by a TemplateProcessing post-processor
          (Llama 3's pipeline);
  smollm  Digits (one per token) then ByteLevel (SmolLM's pipeline), with a
          merge "1 2" that Digits must keep unused;
  qwen2   an NFC normalizer (also as a Sequence holding it), Qwen2's Split
          regex (single digits), ChatML special tokens and a normalized added
          token with an accent, held-out text with accents decomposed;
  wide    gpt2's with model.vocab filled past 65536 ids and a special token
          after them: its token file is llm.c's Llama 3 format (uint32).
Then `fsdp-tokenize --ids` (with and without --special) must give exactly the
ids `tokenizers` gives on held-out text, a token file (GPT-2's uint16 format
up to 65536 ids, else Llama 3's uint32) must hold the document token then
those ids, and decoding it must give the text back. Last, WordPiece, Unigram,
a SentencePiece-style BPE (TinyLlama's: Metaspace, byte fallback) and
normalizers other than NFC must be refused with a message naming what they
are.

usage: compare_hf_json.py FSDP_TOKENIZE WORKDIR   (run by tests/tokenizer/test_hf.sh)
"""
import json
import os
import struct
import subprocess
import sys
import unicodedata

from tokenizers import (Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers,
                        processors, trainers)

LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
               r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                  "<|end_header_id|>", "<|eot_id|>"]

ENGLISH = [  # when Debian's fortunes are not installed
    "It's the dog's day, isn't it? We'll see; they've said you'd be there, I'm sure.",
    "The quick brown fox jumps over the lazy dog, and the dog doesn't mind at all.",
    "You can't always get what you want, but if you try sometimes you'll find it.",
    "Programs must be written for people to read, and only incidentally for machines.",
    "Premature optimization is the root of all evil (or at least most of it).",
    "There are 10 kinds of people: those who understand binary and those who don't.",
] * 12

MIXED_TRAIN = [
    "Ελληνικά: η γρήγορη καφέ αλεπού πηδά πάνω από τον τεμπέλη σκύλο. Καλημέρα σας!",
    "Русский: съешь же ещё этих мягких французских булок, да выпей чаю. Привет, мир!",
    "日本語のテキストです。東京は日本の首都です。中文：我们今天去公园散步吧。",
    "한국어 문장입니다. 오늘은 날씨가 좋네요.",
    "Numbers 12345, 3.14159, 2024-05-20, 1,000,000 and ½ ٣ Ⅻ; call 555-0199 at 09:30.",
    "Emoji 🙂🙃👍🏽 and 👩‍💻 with symbols ©®™ — dashes – and … ellipses.",
    "CONTRACTIONS: DON'T, WON'T, I'M, YOU'RE, THEY'VE, WE'LL, HE'D, it'S, she'Ll.",
    "    indented code()  {\n\treturn x  +  y;\n}\r\n\r\n\n",
    "Unicode spaces: a\u00a0b,\u3000c\u3000\u3000\u3000d. e\u2003\u2003\u2003\u2003f — 100\u00a0km.",
] * 10

# Accented text, each sentence written composed (NFC) and decomposed (NFD).
ACCENTS = [
    "Café crème, déjà vu, naïve façade; Ångström, Øresund, São Paulo, Zürich, Kraków.",
    "Tiếng Việt có dấu: Hà Nội, Đà Nẵng, phở bò, người Việt Nam.",
    "Ελληνικά με τόνους: άλφα, έψιλον, ήτα, ϊ, ΰ. Español: año, pingüino, acción.",
]
ACCENTS_TRAIN = [unicodedata.normalize(f, t) for t in ACCENTS for f in ("NFC", "NFD")] * 8
ACCENTS_HELD_OUT = [
    unicodedata.normalize("NFD", "Le garçon mangea une crème brûlée à Besançon, très élégant."),
    "mixed: e\u0301 é A\u030a Å \u212b \u1100\u1161 \u0958 o\u0308\u0301 \u1e69 s\u0323\u0307 "
    "caf\u00e9:: cafe\u0301:: <|im_start|>syste\u0300m<|im_end|>",
    unicodedata.normalize("NFD", ACCENTS[1]) + " " + ACCENTS[2],
]

HELD_OUT = [
    "Ο καιρός σήμερα είναι υπέροχος· πάμε για περίπατο στην παραλία;",
    "Москва — столица России, а Санкт-Петербург называют северной столицей.",
    "東京タワーから富士山が見えます。我喜欢在早上喝咖啡。",
    "She'd've said THEY'RE fine; I'LL know, we'Ve seen it, y'all 'tis.",
    "Digits: 1 12 123 1234 12345 123456 3.1415926535 ٣٤٥ ①② 10,000,000.",
    "Emoji runs 🎉🎉🎉 👨‍👩‍👧‍👦 🇬🇷🇷🇺 and 🤔? Symbols: ∑∫√∞ ≠ ≤ ≥.",
    "tabs\tand\nnewlines\r\n\r\n\n  and   \n  mixed   whitespace \t\n" + " " * 40 + "end",
    "Unicode spaces:\u00a0no-break,\u3000ideographic\u3000\u3000\u3000.\u2003em \u2003\u2003\u2003\u2003"
    "(run)\u2028line\u0085. 20\u00a0km\u00a0\u00a0\u00a0!",
    "punctuation!!! ??? ... ;;; :-) <html> </html> a+b=c [[x]] {{y}} <|not special|>",
    "<|begin_of_text|>Hello<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi!<|end_of_text|>"
    " <|eot <|start<|eot_i <|im_start|>x<|im_end|>",
    "text<|endoftext|>more text <|endoftext|> end ::sep:: after ::se",
    "x" * 3000 + "\n" * 500 + "dog" * 700,
]


def english():
    """Training and held-out English: the fortunes file split in halves."""
    path = "/usr/share/games/fortunes/fortunes"
    if os.path.exists(path):
        parts = [p.strip() for p in open(path, encoding="utf-8", errors="replace").read().split("\n%\n")]
        parts = [p for p in parts if p]
        half = len(parts) // 2
        return "\n\n".join(parts[:half])[:6000], "\n\n".join(parts[half:])[:4000], "fortunes"
    return "\n".join(ENGLISH[:40]), "\n".join(ENGLISH[40:]), "embedded"


def train(pre, special, text, vocab_size, normalizer=None, **bpe):
    tok = Tokenizer(models.BPE(**bpe))
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=special,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(text, trainer=trainer)
    return tok


def build(work, train_text):
    """The three tokenizer.json files: {name: path}."""
    out = {}
    gpt2 = train(pre_tokenizers.ByteLevel(add_prefix_space=False), ["<|endoftext|>"],
                 train_text, 900)
    out["gpt2"] = save(gpt2, work, "gpt2")
    # The same vocabulary with its merges as "a b" strings (older files).
    j = json.load(open(out["gpt2"], encoding="utf-8"))
    assert all(isinstance(m, list) for m in j["model"]["merges"]), "expected [a, b] merges"
    j["model"]["merges"] = [" ".join(m) for m in j["model"]["merges"]]
    out["gpt2-strings"] = write_json(j, work, "gpt2-strings")

    llama = train(pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)]),
        [], train_text, 1000, ignore_merges=True)
    # Whole words the merges do not make: with ignore_merges they are one token.
    llama = extend(llama, work, "llama3-words", [" столица", "Москва", " Tokyo"], [])
    llama.add_special_tokens(["<|eot", "<|start"] + LLAMA3_SPECIAL)  # prefixes first: longest wins
    llama.add_tokens(["::sep::"])
    bos = llama.token_to_id("<|begin_of_text|>")
    llama.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", bos)])
    j = json.load(open(save(llama, work, "llama3"), encoding="utf-8"))
    j["model"]["ignore_merges"] = True  # whatever the trainer kept: Llama 3's setting
    out["llama3"] = write_json(j, work, "llama3")

    smol = train(pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]),
        ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], train_text, 800)
    smol = extend(smol, work, "smollm-12", ["12"], [["1", "2"]])  # Digits keeps it unused
    out["smollm"] = save(smol, work, "smollm")

    qwen = train(pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)]),
        ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], train_text + ACCENTS_TRAIN, 1000,
        normalizer=normalizers.NFC())
    qwen.add_tokens(["caf\u00e9::"])  # normalized: found in cafe + U+0301 too
    out["qwen2"] = save(qwen, work, "qwen2")
    j = json.load(open(out["qwen2"], encoding="utf-8"))
    assert j["normalizer"] == {"type": "NFC"}, j["normalizer"]
    j["normalizer"] = {"type": "Sequence", "normalizers": [{"type": "NFC"}]}
    out["qwen2-sequence"] = write_json(j, work, "qwen2-sequence")

    # More ids than uint16 holds: filler tokens no merge makes, then a special token.
    j = json.load(open(out["gpt2"], encoding="utf-8"))
    vocab = j["model"]["vocab"]
    for i in range(len(vocab), 70000):
        vocab[f"~q{i}"] = i
    wide = Tokenizer.from_file(write_json(j, work, "wide"))
    wide.add_special_tokens(["<|wide|>"])
    assert wide.token_to_id("<|wide|>") == 70000
    out["wide"] = save(wide, work, "wide")
    return out


def byte_spelling(text):
    """GPT-2's byte-to-unicode spelling of text's UTF-8 bytes."""
    keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    alphabet, extra = {}, 0
    for b in range(256):
        alphabet[b] = chr(b) if b in keep else chr(256 + extra)
        extra += b not in keep
    return "".join(alphabet[b] for b in text.encode("utf-8"))


def extend(tok, work, name, words, merges):
    """tok with the tokens `words` (and `merges`) appended to model.vocab."""
    j = json.load(open(save(tok, work, name), encoding="utf-8"))
    vocab = j["model"]["vocab"]
    for w in words:
        vocab[byte_spelling(w)] = len(vocab)
    j["model"]["merges"] += merges
    return Tokenizer.from_file(write_json(j, work, name))


def save(tok, work, name):
    d = os.path.join(work, name)
    os.makedirs(d, exist_ok=True)
    tok.save(os.path.join(d, "tokenizer.json"))
    return os.path.join(d, "tokenizer.json")


def write_json(j, work, name):
    d = os.path.join(work, name)
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "tokenizer.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False)
    return path


def run(args):
    return subprocess.run(args, capture_output=True)


def fsdp_ids(exe, path, text_path, special):
    r = run([exe, "--vocab", path, "--ids", text_path] + (["--special"] if special else []))
    if r.returncode:
        sys.stdout.write(r.stderr.decode())
        return None
    return [int(x) for x in r.stdout.split()]


def compare(name, what, got, want):
    ok = got == want
    print(f"{'ok' if ok else 'MISMATCH'}: {name} {what}: {len(want)} tokens")
    if not ok and got is not None:
        k = next((j for j, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        print(f"  first difference at token {k} of {len(got)}/{len(want)}: fsdp {got[k:k+8]} "
              f"tokenizers {want[k:k+8]}")
    return 0 if ok else 1


def check_tokenizer(exe, work, name, path, texts):
    hf = Tokenizer.from_file(path)
    j = json.load(open(path, encoding="utf-8"))
    print(f"{name}: {len(j['model']['vocab'])} model ids, {len(j['model']['merges'])} merges, "
          f"{len(j['added_tokens'])} added tokens, {hf.get_vocab_size()} ids")
    failures = 0
    for i, text in enumerate(texts):
        tp = os.path.join(work, f"{name}-case{i}.txt")
        with open(tp, "w", encoding="utf-8", newline="") as f:
            f.write(text)
        for special in (False, True):
            hf.encode_special_tokens = not special  # special tokens as plain text, as without --special
            want = hf.encode(text, add_special_tokens=False).ids
            got = fsdp_ids(exe, path, tp, special)
            failures += compare(name, f"case {i} ({len(text)} chars) special={special}", got, want)
    # A token file: the document token, then the text's ids; decoded back.
    hf.encode_special_tokens = False
    doc = os.path.join(work, f"{name}-doc.txt")
    text = texts[0]
    with open(doc, "w", encoding="utf-8", newline="") as f:
        f.write(text)
    shard = os.path.join(work, f"{name}.bin")
    special = ["--special"] if hf.get_vocab_size() > 65536 else []  # its ids beyond uint16
    r = run([exe, "--vocab", path, "--overwrite", "--out", shard, doc] + special)
    if r.returncode:
        sys.stdout.write(r.stderr.decode())
        return failures + 1
    ids, ok = token_file(shard, hf.get_vocab_size())
    failures += not ok
    if j.get("post_processor") and j["post_processor"]["type"] == "TemplateProcessing":
        want = hf.encode(text).ids  # the post-processor puts <|begin_of_text|> first
        first = "<|begin_of_text|>"
    else:
        want = [hf.token_to_id("<|endoftext|>")] + hf.encode(text, add_special_tokens=False).ids
        first = "<|endoftext|>"
    failures += compare(name, f"token file ({first} first)", ids, want)
    back = run([exe, "--vocab", path, "--decode", shard]).stdout
    if j.get("normalizer"):  # NFC, the one normalizer read: decoding gives the normalized text
        text = unicodedata.normalize("NFC", text)
    ok = back == (first + text).encode("utf-8")
    print(f"{'ok' if ok else 'MISMATCH'}: {name} decode(token file) == {first} + text")
    return failures + (not ok)


def token_file(path, vocab_size):
    """The ids of an llm.c token file, and whether its format is the one for
    vocab_size: GPT-2's (20240520, 1, uint16) up to 65536 ids, else Llama
    3's (20240801, 7, uint32)."""
    raw = open(path, "rb").read()
    magic, version, count = struct.unpack("<3i", raw[:12])
    width = 4 if vocab_size > 65536 else 2
    want = (20240801, 7) if width == 4 else (20240520, 1)
    ok = (magic, version) == want and len(raw) == 1024 + width * count
    print(f"{'ok' if ok else 'MISMATCH'}: {os.path.basename(path)}: magic {magic} version "
          f"{version}, {count} tokens in {len(raw)} bytes (want {want}, {width}-byte tokens)")
    fmt = "<%d%s" % (count, "I" if width == 4 else "H")
    return list(struct.unpack(fmt, raw[1024:1024 + width * count])) if ok else [], ok


def refused(exe, work):
    """Other tokenizer kinds: refused, the message naming what they are."""
    kinds = {}
    wp = Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1, "##b": 2}, unk_token="[UNK]"))
    wp.pre_tokenizer = pre_tokenizers.Whitespace()
    kinds["wordpiece"] = (wp, "model.type is WordPiece")
    kinds["unigram"] = (Tokenizer(models.Unigram([("<unk>", 0.0), ("a", -1.0)], 0, False)),
                        "model.type is Unigram")
    sp = Tokenizer(models.BPE({"<unk>": 0, "<0x41>": 1, "▁": 2, "a": 3}, [], unk_token="<unk>",
                              byte_fallback=True, fuse_unk=True))
    sp.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    sp.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback()])
    kinds["sentencepiece-bpe"] = (sp, "model.byte_fallback is true: a SentencePiece-style BPE")
    meta = Tokenizer(models.BPE({"<unk>": 0, "▁a": 1}, [], unk_token="<unk>"))
    meta.pre_tokenizer = pre_tokenizers.Metaspace()
    kinds["metaspace"] = (meta, "Metaspace: a SentencePiece-style BPE")
    for norm, what in ((normalizers.NFKC(), "normalizer: NFKC;"),
                       (normalizers.Sequence([normalizers.NFC(), normalizers.Lowercase()]),
                        "normalizer.normalizers[1]: Lowercase;")):
        tok = Tokenizer(models.BPE({"a": 0}, []))
        tok.normalizer = norm
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        kinds[what.split(":")[1].strip(" ;").lower() + "-normalizer"] = (tok, what)
    failures = 0
    for name, (tok, want) in kinds.items():
        path = save(tok, work, name)
        r = run([exe, "--vocab", path, "--ids", path])
        err = r.stderr.decode()
        ok = r.returncode == 1 and want in err and path in err
        print(f"{'ok' if ok else 'MISMATCH'}: {name} refused: {err.strip()}")
        failures += not ok
    return failures


def main():
    exe, work = sys.argv[1], sys.argv[2]
    train_en, held_en, source = english()
    train_text = [train_en] + MIXED_TRAIN
    print(f"English from {source}: {len(train_en)} chars to train, {len(held_en)} held out; "
          f"{sum(len(t.encode()) for t in train_text)} bytes of training text")
    texts = [held_en + "\n" + "\n".join(HELD_OUT[:6])] + HELD_OUT
    extra = {"qwen2": ACCENTS_HELD_OUT, "qwen2-sequence": ACCENTS_HELD_OUT,
             "wide": ["x <|wide|> y<|wide|>" + held_en[:500]]}
    failures = 0
    for name, path in build(work, train_text).items():
        more = extra.get(name, [])
        first = [texts[0] + "\n" + more[0]] if more else texts[:1]
        failures += check_tokenizer(exe, work, name, path, first + texts[1:] + more)
    failures += refused(exe, work)
    print(f"{failures} mismatches")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
