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
  tokenizer_reference.py lm-text FOLDER SEQ
      reads plain text on stdin and writes the records `tunegraph data convert --format
      text --seq SEQ` makes of it, one line of ids each: the tokens of every line that is
      not blank (LF or CRLF ends, a UTF-8 byte order mark left out), no special tokens,
      each followed by the eos token that FOLDER/tokenizer_config.json names (as
      transformers' eos_token_id), cut into SEQ tokens; a last record of one token is
      dropped. FOLDER holds the tokenizer.json.
  tokenizer_reference.py dump-ids
      reads `tunegraph data dump` JSON Lines on stdin and writes each record's input_ids
      as one line of space-separated ids.
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


def cmd_lm_text(argv):
    import json

    folder, seq = argv[0], int(argv[1])
    tok = load(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), encoding="utf-8") as f:
        eos = json.load(f)["eos_token"]
    eos_id = tok.token_to_id(eos["content"] if isinstance(eos, dict) else eos)
    data = sys.stdin.buffer.read()
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    texts = []
    for line in data.split(b"\n"):
        if line.endswith(b"\r"):
            line = line[:-1]
        if line.strip(b" \t\r\f\v"):
            texts.append(line.decode("utf-8"))
    stream = []
    for e in tok.encode_batch(texts, add_special_tokens=False):
        stream.extend(e.ids)
        stream.append(eos_id)
    records = [stream[i : i + seq] for i in range(0, len(stream), seq)]
    if records and len(records[-1]) < 2:
        records.pop()
    for r in records:
        sys.stdout.write(" ".join(map(str, r)) + "\n")


def cmd_dump_ids(argv):
    import json

    for line in sys.stdin:
        sys.stdout.write(" ".join(map(str, json.loads(line)["input_ids"])) + "\n")


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
    if len(sys.argv) < 3 and sys.argv[1:] != ["dump-ids"]:
        sys.exit(__doc__)
    cmd, argv = sys.argv[1], sys.argv[2:]
    commands = {
        "encode": cmd_encode,
        "roberta": cmd_roberta,
        "vocab-txt": cmd_vocab_txt,
        "lm-text": cmd_lm_text,
        "dump-ids": cmd_dump_ids,
        "time": cmd_time,
    }
    commands.get(cmd, lambda _: sys.exit(__doc__))(argv)


if __name__ == "__main__":
    main()
