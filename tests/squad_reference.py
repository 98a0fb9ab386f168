#!/usr/bin/env python3
"""Reference answers for tests/test_squad_metric.c: the official SQuAD v2.0 evaluation's
normalization, exact match and F1 (evaluate-v2.0.py, which Hugging Face's squad_v2 metric
runs), and Hugging Face run_qa's post-processing of start/end logits into answers
(utils_qa.postprocess_qa_predictions), both restated here from their published source,
run over a fixed set of tricky strings and seeded random cases.

  squad_reference.py OUT.json      writes the cases and their answers (needs numpy)

The committed tests/data/squad_reference.json was written by this script; rerun it after
changing the cases. Logits are float32 and written as their bit patterns, so that the C
side reads exactly the values numpy summed.
"""
import collections
import json
import random
import re
import string
import struct
import sys

import numpy as np


# ---- evaluate-v2.0.py ------------------------------------------------------------------
def normalize_answer(s):
    def remove_articles(text):
        return re.sub(re.compile(r"\b(a|an|the)\b", re.UNICODE), " ", text)

    def white_space_fix(text):
        return " ".join(text.split())

    def remove_punc(text):
        exclude = set(string.punctuation)
        return "".join(ch for ch in text if ch not in exclude)

    return white_space_fix(remove_articles(remove_punc(s.lower())))


def get_tokens(s):
    return normalize_answer(s).split() if s else []


def compute_exact(a_gold, a_pred):
    return int(normalize_answer(a_gold) == normalize_answer(a_pred))


def compute_f1(a_gold, a_pred):
    gold_toks, pred_toks = get_tokens(a_gold), get_tokens(a_pred)
    common = collections.Counter(gold_toks) & collections.Counter(pred_toks)
    num_same = sum(common.values())
    if len(gold_toks) == 0 or len(pred_toks) == 0:
        return int(gold_toks == pred_toks)
    if num_same == 0:
        return 0
    precision = 1.0 * num_same / len(pred_toks)
    recall = 1.0 * num_same / len(gold_toks)
    return (2 * precision * recall) / (precision + recall)


def score(pred, golds):
    gold_answers = [a for a in golds if normalize_answer(a)] or [""]
    return max(compute_exact(a, pred) for a in gold_answers), max(compute_f1(a, pred) for a in gold_answers)


# ---- utils_qa.postprocess_qa_predictions, one example ----------------------------------
def postprocess(windows, n_best, max_len, threshold, v2):
    """windows: [(start_logits, end_logits, offsets)] with float32 logits and offsets a list
    of (start, end) or None. Returns (kind, start, end, score_diff)."""
    min_null, prelim = None, []
    for start_logits, end_logits, offsets in windows:
        null_score = start_logits[0] + end_logits[0]
        if min_null is None or min_null["score"] > null_score:
            min_null = {"offsets": (0, 0), "score": null_score, "start_logit": start_logits[0],
                        "end_logit": end_logits[0], "null": True}
        # A stable argsort read backwards: equal logits put the later position first.
        starts = np.argsort(start_logits, kind="stable")[-1:-n_best - 1:-1].tolist()
        ends = np.argsort(end_logits, kind="stable")[-1:-n_best - 1:-1].tolist()
        for s in starts:
            for e in ends:
                if s >= len(offsets) or e >= len(offsets) or offsets[s] is None or offsets[e] is None:
                    continue
                if e < s or e - s + 1 > max_len:
                    continue
                prelim.append({"offsets": (offsets[s][0], offsets[e][1]), "score": start_logits[s] + end_logits[e],
                               "start_logit": start_logits[s], "end_logit": end_logits[e], "null": False})
    if v2:
        prelim.append(min_null)
        null_score = min_null["score"]
    predictions = sorted(prelim, key=lambda x: x["score"], reverse=True)[:n_best]
    if v2 and not any(p["offsets"] == (0, 0) for p in predictions):
        predictions.append(min_null)
    if len(predictions) == 0 or (len(predictions) == 1 and predictions[0]["null"]):
        predictions.insert(0, {"offsets": None, "start_logit": 0.0, "end_logit": 0.0, "null": False, "empty": True})
    if not v2:
        p = predictions[0]
        return ("empty", 0, 0, 0.0) if p.get("empty") else ("span", p["offsets"][0], p["offsets"][1], 0.0)
    i = 0
    while predictions[i]["null"]:
        i += 1
    best = predictions[i]
    diff = np.float32(null_score - best["start_logit"] - best["end_logit"])
    if diff > threshold:
        return "null", 0, 0, float(diff)
    if best.get("empty"):
        return "empty", 0, 0, float(diff)
    return "span", best["offsets"][0], best["offsets"][1], float(diff)


# ---- the cases ---------------------------------------------------------------------------
FIXED = [
    "", " ", "The", "the cat", "A", "an", "An apple", "THE END", "the.", "a,b", "don't", "The  quick\tbrown\nfox",
    "Theatre", "another", "a-the-an", "a_b", "über the Straße", "ΟΔΟΣ", "ΑΣ ΑΣΑ", "Σ", "ΑΣ.", "İstanbul",
    "1,000 people", "  leading and trailing  ", "\u00a0nbsp\u00a0the\u3000ideographic", "x\u200by", "ﬁ ligature",
    "naïve café", "한국어 the 텍스트", "中文，標點", "é the é", "théâtre the", "'the'", "(an)", "a\u0301 an",
    "\u00c9COLE", "$5.00", "the the the", "Ǆ", "ῼ", "K", "\x1c\x1dx\x1e\x1fy\x85z",
    # every whitespace str.split() knows, and neighbours that are not
    "a\tb\nc\x0bd\x0ce\rf\x1cg\x1dh\x1ei\x1fj k\x85l\xa0m\u1680n\u2000o\u2005p\u200aq\u2028r\u2029s"
    "\u202ft\u205fu\u3000v\u200bw\u2060x\u180ey\ufeffz\x08!\x0e~",
    # every ASCII punctuation range, and the characters just beside them
    "x!/y:@z[`w{~v 0 9 A Z a z \x7f",
    # final sigma with each kind of case-ignorable character between, and uncased before
    "AΣ\u0301", "AΣ\u0488", "AΣ\u200d", "AΣʰ", "AΣ˘", "A'Σ", "A.Σ B", "1Σ", "ʰΣ", "AΣ\u0301b", "AΣʰB",
    "ǅΣ", "ᾼΣ", "AΣ\u00adb",
    # near-articles
    "tha thx tae th t an a ann aa the2 the_ _the", "A\u0301N", "Ⓐ an", "١ the ٢",
]
WORDS = ["the", "a", "an", "The", "A", "AN", "cat", "Dog", "über", "Straße", "ΟΔΟΣ", "naïve", "1990", "U.S.",
         "don't", "co-op", "x", "İ", "ß", "ﬂ", "中文", "—", "…", "e\u0301", "'", '"', "(", ")", "#1", "$", "%"]
SEPS = [" ", "  ", "\t", "\n", "\u00a0", "\u2009", "\u3000", ",", ".", "-", ""]


def random_text(rng, max_words=6):
    n = rng.randint(0, max_words)
    return "".join(rng.choice(WORDS) + rng.choice(SEPS) for _ in range(n))


def f32_bits(x):
    return struct.unpack("<I", struct.pack("<f", float(x)))[0]


def main():
    rng = random.Random(20261126)
    strings = FIXED + [random_text(rng) for _ in range(300)]
    normalize = [{"text": s, "normalized": normalize_answer(s)} for s in strings]
    scores = []
    for s in FIXED:
        scores.append((s, [s]))
    for _ in range(400):
        golds = [random_text(rng) for _ in range(rng.randint(0, 3))]
        pred = rng.choice(golds + [random_text(rng)]) if golds and rng.random() < 0.3 else random_text(rng)
        scores.append((pred, golds))
    scored = []
    for pred, golds in scores:
        exact, f1 = score(pred, golds)
        scored.append({"pred": pred, "gold": golds, "exact": exact, "f1": f1})

    post = []
    for case in range(300):
        v2 = rng.random() < 0.7
        n_best = rng.choice([1, 2, 3, 5, 20])
        max_len = rng.choice([1, 2, 4, 30])
        threshold = rng.choice([0.0, 0.0, -1.5, 2.0])
        windows = []
        for _ in range(rng.randint(1, 3)):
            length = rng.randint(2, 24)
            question = rng.randint(0, length - 1)
            # Few distinct values now and then, so that ties are tested.
            pool = [rng.uniform(-4, 4) for _ in range(rng.choice([3, 50]))]
            sl = np.array([rng.choice(pool) for _ in range(length)], dtype=np.float32)
            el = np.array([rng.choice(pool) for _ in range(length)], dtype=np.float32)
            offsets, at = [], 0
            for p in range(length):
                if p <= question or p == length - 1:
                    offsets.append(None)
                else:
                    width = rng.randint(1, 5)
                    offsets.append((at, at + width))
                    at += width + rng.randint(0, 1)
            windows.append((sl, el, offsets))
        kind, start, end, diff = postprocess(windows, n_best, max_len, threshold, v2)
        post.append({
            "v2": v2, "n_best": n_best, "max_answer_len": max_len, "null_threshold": threshold,
            "windows": [{"start_logits": [f32_bits(x) for x in sl], "end_logits": [f32_bits(x) for x in el],
                         "offsets": [o if o else [-1, -1] for o in offsets]} for sl, el, offsets in windows],
            "answer": {"kind": kind, "start": start, "end": end, "score_diff": f32_bits(diff)},
        })
    with open(sys.argv[1], "w", encoding="utf-8") as f:
        json.dump({"normalize": normalize, "score": scored, "postprocess": post}, f, ensure_ascii=False, indent=0)
        f.write("\n")


if __name__ == "__main__":
    main()
