#!/usr/bin/env python3
"""Writes a SQuAD v2.0 JSON file of random English-word contexts and questions for benchmarks.

usage: make_synthetic_squad.py OUT.json --paragraphs P [--questions Q] [--words W] [--seed S]
Each context holds W words (default 420: more than one 384-token window, so contexts are
split with doc_stride as run_qa splits them); each of its Q questions (default 4) asks for a
span of 1-4 words at its exact answer_start, every third one unanswerable (SQuAD v2).
"""
import argparse
import json
import random

WORDS = ("the of and to in is was for on that with as by at from his her which an be this are have had "
         "not but were they one all their been has more when who will would there its also after first "
         "new two other some time into only can most years could over city state world war may later "
         "school during made many between such team where part known season while both under three film "
         "before then government music work being through life album river system number each since "
         "until company people early called house national following series several song about until "
         "second public well name game county including became area law against group played family "
         "university north south east west history center form church club began century local main").split()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--paragraphs", type=int, required=True)
    ap.add_argument("--questions", type=int, default=4)
    ap.add_argument("--words", type=int, default=420)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    paragraphs, qid = [], 0
    for _ in range(a.paragraphs):
        words = [rng.choice(WORDS) for _ in range(a.words)]
        context = " ".join(words)
        starts, at = [], 0
        for w in words:
            starts.append(at)
            at += len(w) + 1
        qas = []
        for k in range(a.questions):
            question = " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 14))) + "?"
            q = {"id": "q%d" % qid, "question": question}
            qid += 1
            if k % 3 == 2:
                q.update(is_impossible=True, answers=[])
            else:
                first = rng.randrange(a.words - 4)
                n = rng.randint(1, 4)
                text = " ".join(words[first:first + n])
                assert context[starts[first]:starts[first] + len(text)] == text
                q.update(is_impossible=False, answers=[{"text": text, "answer_start": starts[first]}])
            qas.append(q)
        paragraphs.append({"context": context, "qas": qas})
    doc = {"version": "v2.0", "data": [{"title": "synthetic", "paragraphs": paragraphs}]}
    with open(a.out, "w") as f:
        json.dump(doc, f)


if __name__ == "__main__":
    main()
