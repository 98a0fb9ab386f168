#!/usr/bin/env python3
"""The BBC News articles as Alpaca instruction records, for `tunegraph data convert --format instruct`.

Reads ROOT/TOPIC/*.txt (scripts/fetch_assets.sh bbcnews puts them in build/assets/bbc-news;
the first line of each article is its title, the rest its body) and writes JSON Lines, two
records per article, in topic and file name order:

  {"instruction": "Write a headline for this news article.", "input": BODY, "output": TITLE}
  {"instruction": "Which topic is this news article about: business, entertainment, politics,
   sports or tech?", "input": BODY, "output": TOPIC}

BODY is the article's first --words words (its line breaks become spaces), with " ..." when
it was cut. A file that is not UTF-8 (sports/199.txt, a Latin-1 pound sign) is left out and
named on stderr.

  examples/bbc-news/make_instruct.py [--root DIR] [--words N] [--tasks headline,topic] -o OUT.jsonl
"""
import argparse
import json
import os
import sys

HEADLINE = "Write a headline for this news article."


def topic_instruction(topics):
    return "Which topic is this news article about: " + ", ".join(topics[:-1]) + " or " + topics[-1] + "?"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default="build/assets/bbc-news", help="the articles, one folder per topic")
    ap.add_argument("--words", type=int, default=40, help="words of the body kept as the input (default 40)")
    ap.add_argument("--tasks", default="headline,topic", help="which records to write: headline, topic or both")
    ap.add_argument("-o", "--output", required=True, help="the JSON Lines file to write")
    args = ap.parse_args()
    tasks = [t for t in args.tasks.split(",") if t]
    if not tasks or any(t not in ("headline", "topic") for t in tasks):
        ap.error("--tasks takes headline, topic or headline,topic")
    if args.words < 1:
        ap.error("--words must be 1 or more")
    topics = sorted(d for d in os.listdir(args.root) if os.path.isdir(os.path.join(args.root, d)))
    if not topics:
        sys.exit(f"make_instruct: no topic folders in {args.root} (scripts/fetch_assets.sh bbcnews fetches them)")
    records = skipped = 0
    tmp = args.output + ".tmp"
    with open(tmp, "w", encoding="utf-8") as out:
        for topic in topics:
            folder = os.path.join(args.root, topic)
            for name in sorted(f for f in os.listdir(folder) if f.endswith(".txt")):
                path = os.path.join(folder, name)
                try:
                    with open(path, encoding="utf-8") as f:
                        lines = f.read().splitlines()
                except UnicodeDecodeError:
                    print(f"make_instruct: {path}: not UTF-8, left out", file=sys.stderr)
                    skipped += 1
                    continue
                title = lines[0].strip() if lines else ""
                words = " ".join(lines[1:]).split()
                if not title or not words:
                    print(f"make_instruct: {path}: no title or no body, left out", file=sys.stderr)
                    skipped += 1
                    continue
                body = " ".join(words[: args.words]) + (" ..." if len(words) > args.words else "")
                for task in tasks:
                    if task == "headline":
                        rec = {"instruction": HEADLINE, "input": body, "output": title}
                    else:
                        rec = {"instruction": topic_instruction(topics), "input": body, "output": topic}
                    out.write(json.dumps(rec, ensure_ascii=False) + "\n")
                    records += 1
    os.replace(tmp, args.output)
    print(f"make_instruct: wrote {records} records to {args.output} ({skipped} articles left out)", file=sys.stderr)


if __name__ == "__main__":
    main()
