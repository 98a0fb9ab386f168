#!/usr/bin/env python3
"""Reference token ids from Hugging Face `tokenizers`, for the agreement test
(tests/test_tokenizer_agreement.sh) and the throughput benchmark.

  tokenizer_reference.py roberta GPT2_DIR OUT.json
      writes a RoBERTa tokenizer.json built from GPT-2's encoder.json + vocab.bpe:
      byte-level BPE, <s> <pad> </s> <unk> <mask> as special tokens (<mask> taking the
      whitespace before it, as RoBERTa's does), RobertaProcessing's <s> A </s></s> B </s>.
  tokenizer_reference.py vocab-txt TOKENIZER_JSON OUT_DIR
      writes the WordPiece vocabulary of a tokenizer.json as OUT_DIR/vocab.txt, with a
      tokenizer_config.json saying do_lower_case as the tokenizer.json's normalizer does.
  tokenizer_reference.py encode SPEC [--pair] [--max-len N] [--no-special] [--offsets]
      reads lines on stdin (split at '\\n' only; --pair: text TAB pair, split at the first
      TAB) and writes one line of space-separated ids per line, as `tunegraph tokenize`
      does. --offsets writes each token as ID:START-END in UTF-8 bytes of its own text,
      template tokens as ID:-. SPEC is a tokenizer.json, or a folder holding GPT-2's
      encoder.json + vocab.bpe (loaded as transformers' GPT2TokenizerFast builds it).
  tokenizer_reference.py time SPEC FILE [--repeat N] [--per-line]
      times encode_batch (or one encode call a line) over FILE's lines on one thread
      (TOKENIZERS_PARALLELISM=false) and prints "seconds lines bytes tokens".
"""
import os
import sys
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from tokenizers import AddedToken, ByteLevelBPETokenizer, Tokenizer  # noqa: E402
from tokenizers.processors import RobertaProcessing  # noqa: E402


def load(spec):
    if os.path.isdir(spec):
        tok = ByteLevelBPETokenizer(os.path.join(spec, "encoder.json"), os.path.join(spec, "vocab.bpe"))
        tok.add_special_tokens(["<|endoftext|>"])
        tok = tok._tokenizer
    else:
        tok = Tokenizer.from_file(spec)
    tok.no_padding()
    tok.no_truncation()
    return tok


def read_lines(data):
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return [line.decode("utf-8") for line in lines]


def byte_offsets(text):
    """char index -> byte offset, for every index 0..len(text)."""
    out = [0] * (len(text) + 1)
    n = 0
    for i, ch in enumerate(text):
        out[i] = n
        n += len(ch.encode("utf-8"))
    out[len(text)] = n
    return out


def cmd_encode(argv):
    spec = argv[0]
    pair = "--pair" in argv
    special = "--no-special" not in argv
    offsets = "--offsets" in argv
    tok = load(spec)
    if "--max-len" in argv:
        tok.enable_truncation(max_length=int(argv[argv.index("--max-len") + 1]))
    lines = read_lines(sys.stdin.buffer.read())
    if pair:
        inputs = []
        for i, line in enumerate(lines):
            if "\t" not in line:
                sys.exit("stdin:%d: no TAB between text and pair" % (i + 1))
            inputs.append(tuple(line.split("\t", 1)))
    else:
        inputs = lines
    encs = tok.encode_batch(inputs, add_special_tokens=special)
    out = sys.stdout
    for inp, e in zip(inputs, encs):
        if not offsets:
            out.write(" ".join(map(str, e.ids)) + "\n")
            continue
        texts = inp if pair else (inp,)
        maps = [byte_offsets(t) for t in texts]
        parts = []
        for tid, seq, (s, t) in zip(e.ids, e.sequence_ids, e.offsets):
            if seq is None:
                parts.append("%d:-" % tid)
            else:
                parts.append("%d:%d-%d" % (tid, maps[seq][s], maps[seq][t]))
        out.write(" ".join(parts) + "\n")


def cmd_roberta(argv):
    gpt2_dir, out = argv[0], argv[1]
    tok = ByteLevelBPETokenizer(os.path.join(gpt2_dir, "encoder.json"), os.path.join(gpt2_dir, "vocab.bpe"))
    tok.add_special_tokens(["<s>", "<pad>", "</s>", "<unk>"])
    tok.add_special_tokens([AddedToken("<mask>", lstrip=True)])
    tok._tokenizer.post_processor = RobertaProcessing(
        ("</s>", tok.token_to_id("</s>")), ("<s>", tok.token_to_id("<s>")), trim_offsets=True, add_prefix_space=False
    )
    tok.save(out)


def cmd_vocab_txt(argv):
    import json

    src, outdir = argv[0], argv[1]
    with open(src, encoding="utf-8") as f:
        spec = json.load(f)
    vocab = spec["model"]["vocab"]
    tokens = [None] * (max(vocab.values()) + 1)
    for t, i in vocab.items():
        tokens[i] = t
    os.makedirs(outdir, exist_ok=True)
    with open(os.path.join(outdir, "vocab.txt"), "w", encoding="utf-8", newline="\n") as f:
        for t in tokens:
            f.write(t + "\n")
    norm = spec.get("normalizer") or {}
    with open(os.path.join(outdir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({"do_lower_case": bool(norm.get("lowercase", True)), "tokenizer_class": "BertTokenizer"}, f)


def cmd_time(argv):
    spec, path = argv[0], argv[1]
    repeat = int(argv[argv.index("--repeat") + 1]) if "--repeat" in argv else 1
    tok = load(spec)
    with open(path, "rb") as f:
        data = f.read()
    lines = read_lines(data) * repeat
    t0 = time.perf_counter()
    if "--per-line" in argv:
        tokens = sum(len(tok.encode(line).ids) for line in lines)
    else:
        tokens = sum(len(e.ids) for e in tok.encode_batch(lines))
    seconds = time.perf_counter() - t0
    print("%.6f %d %d %d" % (seconds, len(lines), len(data) * repeat, tokens))


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    cmd, argv = sys.argv[1], sys.argv[2:]
    {"encode": cmd_encode, "roberta": cmd_roberta, "vocab-txt": cmd_vocab_txt, "time": cmd_time}.get(
        cmd, lambda _: sys.exit(__doc__)
    )(argv)


if __name__ == "__main__":
    main()
