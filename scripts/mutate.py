"""Mutation testing of the CPU sources: universalmutator's C rules make single-line mutants,
a seeded sample of them is built and run against the suite in parallel worker copies of
the tree, and the score is printed per file and in total. `make mutate` runs it through
scripts/mutate.sh, which installs universalmutator into build/mutate/venv first.

usage: mutate.py --root ROOT --out OUT [--mutants N] [--seed S] [--jobs J] [--files "GLOB..."]
                 [--stop-after SECONDS] [--sanitize] [--whole-suite] [--confirm-survivors]

What happens:
  1. Mutants: universalmutator's regexp mutator (mutator.mutants_regexp, what its `mutate`
     command runs) with the rules that command picks for C (universal, c, c_like) over each
     tracked .c file of compiler/ plan/ runtime/ (less runtime/cuda/) models/ datasets/ cli/
     api/ base/, or of those matching FILES (shell globs on the path). Each mutant changes
     one line; they are kept in memory, not written out as whole files.
  2. Sample: N mutants for seed S, spread over the files in proportion to their mutant
     counts (largest remainders), each file's share taken from the front of its own
     seeded order of its mutants (the generator seeded from S and the path). A mutant that
     does not compile is replaced by the next of its file's order, so that N mutants that
     build are run: the same tree and seed give the same mutants.
  3. Workers: J copies of the tree in OUT/w1..wJ (its tracked and unignored files),
     each with its own build/ folder: the first is built with make, the others start from a
     copy of it. A mutant is written into a worker's copy, make rebuilds only the objects
     that depend on that file (found once per file with `make -n -W`) and relinks; a build
     failure makes the mutant invalid. The suite then runs with TG_TEST_FAIL_FAST=1: a
     failing test, a crash or running past 3x the unmutated suite's time (run by all workers at once) kills it.
     Only the tests that execute the mutated line run (TG_TEST_ONLY), from a map of which test
     reaches which line made once per tree with the coverage build (TestMap; --whole-suite
     turns it off, --confirm-survivors runs each survivor against the whole suite as a check
     of the map); their time limit is 3x their own time alone there, at least 30 s.
     Afterwards the source gets back its text and time stamp and the objects their
     unmutated copies (stamped now, so that the next make relinks them).
     The tests likeliest to kill a mutant of a file run first (TG_TEST_FIRST): those that
     killed its earlier mutants, this run's and earlier runs' (OUT/killers.json), then those
     in test files named after it. The order changes how soon a mutant dies, not whether.
  Each result is appended to OUT/results.jsonl with the tree's identity (a hash of every
     file the workers copy): a later run of the same tree takes a mutant's result from there
     instead of running it again, so that a run cut short (--stop-after stops handing out
     mutants after that many seconds and reports the partial score) is continued by the
     next one.
  4. Report: the score per file and in total, killed / (killed + survived); invalid mutants
     and those in tests/mutation/equivalent.txt are left out. Every survivor is printed as
     a unified diff under file:line; everything goes to OUT/report.json.
"""
import argparse
import difflib
import fcntl
import fnmatch
import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from universalmutator import mutator

SOURCE_DIRS = ["compiler", "plan", "runtime", "models", "datasets", "cli", "api", "base"]
EXCLUDED_DIRS = ["runtime/cuda/"]
# The rules universalmutator's `mutate` uses for a .c file.
RULES = ["universal.rules", "c.rules", "c_like.rules"]
TARGETS = ["build/run_tests", "build/tunegraph"]
# --sanitize: the suite built with AddressSanitizer and UBSan (the Makefile's test-asan
# build), run as test-asan runs it, so that a mutant reading or writing past a buffer,
# leaking or overflowing is killed too.
SANITIZED_TARGETS = ["build/asan/run_tests", "build/asan/tunegraph"]
SANITIZER_ENV = {"ASAN_OPTIONS": "detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1",
                 "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1"}
# The line coverage of each test alone (gcov, -O0), built as `make coverage` builds it.
COVERAGE_TARGETS = ["build/coverage/run_tests", "build/coverage/tunegraph"]
TEST_MAP = "test-map.json"
SUITE_TIME = "suite-time.json"
EQUIVALENT_LIST = "tests/mutation/equivalent.txt"
KILLERS = "killers.json"
RESULTS = "results.jsonl"
# At most this many tests are named first for a file (the environment stays small).
FIRST_TESTS = 40
TIMEOUT_FACTOR = 3
# The suite's own time varies with the load; a floor keeps a short baseline from killing
# slow-but-correct mutants.
MIN_TIMEOUT_S = 30
# The suites running now (each in a session of its own, so that a timeout kills all of it):
# killed when this script is stopped, which would otherwise leave them running.
RUNNING = set()


def stop_suites(sig, frame):
    for pid in list(RUNNING):
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    os._exit(128 + sig)


def log(msg):
    print(msg, flush=True)


def run(cmd, cwd, **kw):
    return subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace", **kw)


def cpu_sources(root, globs):
    out = run(["git", "ls-files", "--"] + [f"{d}/*.c" for d in SOURCE_DIRS], root)
    if out.returncode != 0:
        sys.exit(f"mutate: git ls-files failed: {out.stdout.strip()}")
    files = [f for f in out.stdout.split() if not any(f.startswith(x) for x in EXCLUDED_DIRS)]
    if globs:
        files = [f for f in files if any(fnmatch.fnmatch(f, g) for g in globs)]
    return sorted(files)


def split_trailing_comment(line):
    """(code, comment): a block comment that ends the line after code, split off at its
    "/*" (outside string and character literals); (line, "") for any other line."""
    quote, i = None, 0
    while i < len(line):
        c = line[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = None
        elif c in "\"'":
            quote = c
        elif line.startswith("/*", i):
            end = line.find("*/", i + 2)
            if end < 0 or line[end + 2:].strip() or not line[:i].strip():
                return line, ""
            return line[:i], line[i:]
        elif line.startswith("//", i):
            return line, ""
        i += 1
    return line, ""


def generate(root, files):
    """{path: (source lines, [(line number, mutated line)])}. universalmutator leaves out
    every line holding "/*": a line's trailing comment (a coverage exclusion, a why) is
    taken off before it mutates the code and put back on each mutant, so such lines are
    mutated like the others."""
    table = {}
    devnull = open(os.devnull, "w")
    for path in files:
        with open(os.path.join(root, path)) as f:
            source = f.readlines()
        split = [split_trailing_comment(line) for line in source]
        code = [c + "\n" if t else c for c, t in split]
        # mutants_regexp prints its progress; the report is ours.
        saved, sys.stdout = sys.stdout, devnull
        try:
            found = mutator.mutants_regexp(code, ruleFiles=RULES, ignorePatterns=[], ignoreStringOnly=True)
        finally:
            sys.stdout = saved
        mutants = []
        for m in found:
            line, text = m[0], m[1]
            comment = split[line - 1][1]
            mutants.append((line, text.rstrip("\n") + comment if comment else text))
        table[path] = (source, mutants)
    return table


def sample(table, n, seed):
    """n mutants, each file's share proportional to its count (largest remainders), from
    the front of the file's seeded order; also each file's order, for replacements."""
    counts = {p: len(m) for p, (_, m) in table.items()}
    total = sum(counts.values())
    n = min(n, total)
    if n == 0:
        return [], {}
    exact = {p: n * c / total for p, c in counts.items()}
    share = {p: int(q) for p, q in exact.items()}
    left = n - sum(share.values())
    for p in sorted(exact, key=lambda p: (-(exact[p] - share[p]), p))[:left]:
        share[p] += 1
    chosen, orders = [], {}
    for path in sorted(table):
        mutants = table[path][1]
        order = random.Random(f"{seed}:{path}").sample(range(len(mutants)), len(mutants))
        orders[path] = [(path, mutants[i][0], mutants[i][1]) for i in order]
        chosen += sorted(orders[path][:share[path]], key=lambda m: m[1])
    return chosen, orders


def load_equivalent(root):
    """{(path, line, mutated text stripped): reason}. The file's entries:
         path:line: mutated line
             why: the reason it cannot change behaviour"""
    entries, path = {}, os.path.join(root, EQUIVALENT_LIST)
    if not os.path.exists(path):
        return entries
    key = None
    with open(path) as f:
        for no, line in enumerate(f, 1):
            if not line.strip() or line.startswith("#"):
                continue
            m = re.match(r"^(\S+\.c):(\d+): (.*)$", line.rstrip("\n"))
            if m:
                # A mutant that adds a statement spans lines: "\\n" in the entry stands for them.
                key = (m.group(1), int(m.group(2)), m.group(3).strip().replace("\\n", "\n"))
                entries[key] = None
            elif line.strip().startswith("why:") and key and entries[key] is None:
                entries[key] = line.strip()[4:].strip()
            else:
                sys.exit(f"mutate: {EQUIVALENT_LIST}:{no}: expected 'path.c:line: mutated line' or "
                         f"an indented 'why: reason' after one")
    missing = [k for k, why in entries.items() if not why]
    if missing:
        sys.exit(f"mutate: {EQUIVALENT_LIST}: {missing[0][0]}:{missing[0][1]} has no 'why:' line")
    return entries


class Worker:
    def __init__(self, root, out, index):
        self.root, self.index = root, index
        self.dir = os.path.join(out, f"w{index}")
        # Present while a mutant is in this copy: a run cut short leaves it, and the next
        # run starts that copy's build afresh rather than trust objects of unknown source.
        self.dirty = os.path.join(self.dir, ".mutant-in-place")
        self.objects_of = {}

    def sync(self):
        os.makedirs(self.dir, exist_ok=True)
        if os.path.exists(self.dirty):
            shutil.rmtree(os.path.join(self.dir, "build"), ignore_errors=True)
            os.remove(self.dirty)
        names = self.names = tree_files(self.root)
        # Copies keep their time stamps, so make in the copy rebuilds what changed since the
        # last run; files whose size and time agree are left alone.
        for name in names:
            src, dst = os.path.join(self.root, name), os.path.join(self.dir, name)
            a = os.stat(src)
            try:
                b = os.stat(dst)
                if (a.st_size, a.st_mtime_ns) == (b.st_size, b.st_mtime_ns):
                    continue
            except FileNotFoundError:
                os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copy2(src, dst)
        # Files gone from the tree go from the copy too (the Makefile globs the sources).
        keep = set(names)
        for top, dirs, found in os.walk(self.dir):
            rel = os.path.relpath(top, self.dir)
            if rel == ".":
                dirs[:] = [d for d in dirs if d != "build"]
            for name in found:
                path = os.path.normpath(os.path.join(rel, name))
                if path not in keep:
                    os.remove(os.path.join(self.dir, path))

    def make(self, timeout=None, parallel=1):
        return run(["make", "--no-print-directory", f"-j{parallel}"] + TARGETS, self.dir, timeout=timeout)

    def objects_for(self, path):
        """The objects make rebuilds when path changes (its own, and any that compile it in)."""
        if path not in self.objects_of:
            r = run(["make", "-n", "--no-print-directory", "-W", path] + TARGETS, self.dir)
            self.objects_of[path] = sorted(set(re.findall(r"-c \S+ -o (\S+\.o)", r.stdout)))
        return self.objects_of[path]

    def suite(self, timeout, first=(), only=None):
        env = dict(os.environ, TG_TEST_FAIL_FAST="1", TMPDIR=self.tmp, TG_TEST_FIRST=",".join(first))
        if only is not None:
            env["TG_TEST_ONLY"] = ",".join(only)
        env.pop("TG_TEST_CLI", None)
        env.pop("TG_TEST_DEVICE", None)
        if TARGETS == SANITIZED_TARGETS:
            env.update(SANITIZER_ENV, TG_TEST_CLI="./" + TARGETS[1])
        t0 = time.monotonic()
        p = subprocess.Popen(["./" + TARGETS[0]], cwd=self.dir, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, errors="replace", start_new_session=True)
        RUNNING.add(p.pid)
        try:
            output, _ = p.communicate(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            output, _ = p.communicate()
            timed_out = True
        finally:
            RUNNING.discard(p.pid)
        return p.returncode, timed_out, output, time.monotonic() - t0

    @property
    def tmp(self):
        d = os.path.join(self.dir, "build", "tmp")
        os.makedirs(d, exist_ok=True)
        return d

    def evaluate(self, path, line, text, timeout, first=(), only=None):
        src = os.path.join(self.dir, path)
        with open(src) as f:
            original = f.readlines()
        st = os.stat(src)
        objects = self.objects_for(path)
        saved = os.path.join(self.dir, "build", "unmutated")
        os.makedirs(saved, exist_ok=True)
        copies = []
        for i, obj in enumerate(objects):
            copy = os.path.join(saved, f"{i}.o")
            shutil.copy2(os.path.join(self.dir, obj), copy)
            copies.append((copy, os.path.join(self.dir, obj)))
        open(self.dirty, "w").close()
        result = {"file": path, "line": line, "original": original[line - 1], "mutant": text}
        t0 = time.monotonic()
        try:
            mutated = list(original)
            mutated[line - 1] = text
            with open(src, "w") as f:
                f.writelines(mutated)
            # Newer than every object, whatever the clock's resolution.
            newest = max(os.stat(os.path.join(self.dir, o)).st_mtime for o in objects) if objects else 0
            stamp = max(time.time(), newest + 1)
            os.utime(src, (stamp, stamp))
            built = self.make()
            if built.returncode != 0:
                result["status"] = "invalid"
                error = re.search(r"^.*error:.*$", built.stdout, re.M)
                result["by"] = error.group(0).strip() if error else built.stdout.strip().splitlines()[-1]
            elif copies and all(same_code(copy, obj) for copy, obj in copies):
                # Trivial compiler equivalence: the compiler made the same code of both texts
                # (a 0 written as (0==1), a continue that ends a loop body anyway), so no test
                # can tell them apart.
                result["status"], result["by"] = "equivalent", "the compiler makes the same object code"
            else:
                rc, timed_out, output, secs = self.suite(timeout, first, only)
                failing = re.search(r"^FAIL (\S+)", output, re.M)
                if timed_out:
                    result["status"], result["by"] = "killed", f"timeout after {timeout:.0f} s"
                elif rc != 0:
                    result["status"] = "killed"
                    result["by"] = failing.group(1) if failing else f"exit status {rc} (crash)"
                else:
                    result["status"] = "survived"
                result["suite_seconds"] = round(secs, 1)
                result["tests_run"] = "all" if only is None else len(only)
        finally:
            with open(src, "w") as f:
                f.writelines(original)
            os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))
            now = time.time()
            for copy, obj in copies:
                shutil.copy2(copy, obj)
                os.utime(obj, (now, now))
            os.remove(self.dirty)
        result["seconds"] = round(time.monotonic() - t0, 1)
        return result


def same_code(a, b):
    """Whether two objects hold the same code and data once their debug information (line
    and column numbers, which a mutant's text moves) is set aside."""
    stripped = []
    for path in (a, b):
        out = path + ".nodebug"
        r = run(["objcopy", "--strip-debug", "--remove-section=.comment", path, out], os.path.dirname(path))
        if r.returncode != 0:
            return False
        stripped.append(out)
    try:
        with open(stripped[0], "rb") as x, open(stripped[1], "rb") as y:
            return x.read() == y.read()
    finally:
        for path in stripped:
            os.remove(path)


def tree_files(root):
    """The files a worker's copy holds: tracked, and untracked but not ignored."""
    listed = run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], root)
    if listed.returncode != 0:
        sys.exit(f"mutate: git ls-files failed: {listed.stdout.strip()}")
    return sorted(n for n in listed.stdout.split("\0") if n and os.path.isfile(os.path.join(root, n)))


# Files that cannot change a mutant's fate: the documentation and this tool itself.
def _beside_the_outcome(name):
    # The equivalent list only decides which mutants run, never what one does: correcting
    # it keeps the test map and the results of the tree.
    return (name.endswith(".md") or name.startswith("docs/") or name.startswith("scripts/mutate.")
            or name == EQUIVALENT_LIST)


def tree_identity(copy, names):
    """A hash of the names and contents of the files in a worker's copy that can change a
    mutant's result."""
    h = hashlib.sha256()
    for name in names:
        if _beside_the_outcome(name):
            continue
        h.update(name.encode() + b"\0")
        with open(os.path.join(copy, name), "rb") as f:
            h.update(hashlib.sha256(f.read()).digest())
    return h.hexdigest()[:16]


def load_results(out, tree):
    """{(file, line, mutant): result} of earlier runs of this tree."""
    cached = {}
    try:
        with open(os.path.join(out, RESULTS)) as f:
            for line in f:
                try:
                    r = json.loads(line)
                except ValueError:
                    continue  # a line cut short by a run that was stopped
                if r.get("tree") == tree:
                    cached[(r["file"], r["line"], r["mutant"])] = r
    except OSError:
        pass
    return cached


def tests_by_file(root):
    """{test name: test file stem} for the TG_TEST cases in tests/*.c."""
    found = {}
    for name in sorted(os.listdir(os.path.join(root, "tests"))):
        if name.endswith(".c"):
            with open(os.path.join(root, "tests", name), errors="replace") as f:
                for test in re.findall(r"^TG_TEST\((\w+)\)", f.read(), re.M):
                    found[test] = name[:-2]
    return found


class KillOrder:
    """Which tests to run first for a mutant of each file: the tests that killed mutants of
    it before, most kills first (kept in OUT/killers.json across runs), then the tests of the
    test files whose names share a word (of 4 letters or more) with the file's name."""

    def __init__(self, root, out):
        self.path = os.path.join(out, KILLERS)
        self.tests = tests_by_file(root)
        try:
            with open(self.path) as f:
                saved = json.load(f)
            self.kills = {p: {t: int(n) for t, n in c.items() if t in self.tests} for p, c in saved.items()}
        except (OSError, ValueError, AttributeError):
            self.kills = {}

    def first(self, path):
        counts = self.kills.get(path, {})
        names = sorted(counts, key=lambda t: (-counts[t], t))
        words = [w for w in re.split(r"[_/.]", path[:-2]) if len(w) >= 4]
        names += [t for t, stem in self.tests.items()
                  if t not in counts and any(w in stem for w in words)]
        return names[:FIRST_TESTS]

    def killed(self, path, test):
        if test in self.tests:
            c = self.kills.setdefault(path, {})
            c[test] = c.get(test, 0) + 1

    def save(self):
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.kills, f, indent=1, sort_keys=True)
        os.replace(tmp, self.path)


class TestMap:
    """Which tests reach each line of the CPU sources: every test is run alone in the coverage
    build (`make coverage`'s objects, -O0 --coverage) with its counters written under a folder
    of its own (GCOV_PREFIX), and gcov's JSON says which lines it executed. A mutant of a line
    that some tests reach is run against those tests only: a test that never executes the line
    behaves as on the unmutated tree. The whole suite still runs for a line gcov does not count
    (declarations, macros, initialisers: they act where they are used), for a case label (it
    steers a switch from the switch's line) and for a line no test reaches. Kept in
    OUT/test-map.json for the tree it was made of."""

    # Part of the key of a saved map: a map made by an earlier way of making it is made again.
    VERSION = ":map2"

    def __init__(self, out, tree):
        self.path = os.path.join(out, TEST_MAP)
        self.tree = tree
        self.tests, self.seconds, self.executable, self.reached = [], [], {}, {}

    def load(self):
        try:
            with open(self.path) as f:
                saved = json.load(f)
        except (OSError, ValueError):
            return False
        if saved.get("tree") != self.tree:
            return False
        self.tests = [t for t, _ in saved["tests"]]
        self.seconds = [s for _, s in saved["tests"]]
        self.executable = {p: set(lines) for p, lines in saved["executable"].items()}
        self.reached = {p: {int(n): ts for n, ts in lines.items()} for p, lines in saved["reached"].items()}
        return True

    def save(self):
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"tree": self.tree, "tests": [[t, s] for t, s in zip(self.tests, self.seconds)],
                       "executable": {p: sorted(v) for p, v in self.executable.items()},
                       "reached": {p: {str(n): ts for n, ts in sorted(v.items())} for p, v in self.reached.items()}},
                      f, separators=(",", ":"))
        os.replace(tmp, self.path)

    def build(self, worker, jobs, sources):
        copy = worker.dir
        built = run(["make", "--no-print-directory", f"-j{jobs}"] + COVERAGE_TARGETS, copy)
        if built.returncode != 0:
            sys.exit(f"mutate: the coverage build fails in {copy}:\n{built.stdout[-3000:]}")
        # stdout alone: libgcov may note on stderr how it merged its counters at exit.
        listed = subprocess.run(["./" + COVERAGE_TARGETS[0]], cwd=copy, env=dict(os.environ, TG_TEST_LIST="1"),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace")
        if listed.returncode != 0:
            sys.exit(f"mutate: listing the tests failed:\n{listed.stdout[-2000:]}{listed.stderr[-2000:]}")
        self.tests = [m.group(1) for m in re.finditer(r"^(\w+) \S+\.c$", listed.stdout, re.M)]
        self.seconds = [0.0] * len(self.tests)
        objdir = os.path.join(copy, "build", "coverage")
        # The sources' objects, and those of the test files that compile a source in
        # (tests/test_cli_metrics.c includes cli/*.c): gcov names the source either way.
        including = set()
        for name in os.listdir(os.path.join(copy, "tests")):
            if name.endswith(".c"):
                with open(os.path.join(copy, "tests", name), errors="replace") as f:
                    if re.search(r'^#include "(%s)/[^"]+\.c"' % "|".join(SOURCE_DIRS), f.read(), re.M):
                        including.add(os.path.join("tests", name[:-2] + ".gcno"))
        notes = []
        for top, _, found in os.walk(objdir):
            rel = os.path.normpath(os.path.relpath(top, objdir))
            for n in found:
                note = os.path.normpath(os.path.join(rel, n))
                if n.endswith(".gcno") and (rel.split(os.sep)[0] in SOURCE_DIRS or note in including):
                    notes.append(note)
        strip = len([c for c in os.path.abspath(objdir).split(os.sep) if c])
        scratch = os.path.join(copy, "build", "test-map")
        shutil.rmtree(scratch, ignore_errors=True)
        wanted = set(sources)
        lock, mapped = threading.Lock(), [0]
        log(f"mutate: mapping which of {len(self.tests)} tests reach each line (coverage build, one test at a time)")

        def one(index):
            name = self.tests[index]
            prefix = os.path.join(scratch, str(index))
            tmp = os.path.join(prefix, "tmp")
            os.makedirs(tmp)
            env = dict(os.environ, TG_TEST_ONLY=name, TG_TEST_CLI="./" + COVERAGE_TARGETS[1], TMPDIR=tmp,
                       GCOV_PREFIX=prefix, GCOV_PREFIX_STRIP=str(strip))
            env.pop("TG_TEST_DEVICE", None)
            t0 = time.monotonic()
            r = run(["./" + COVERAGE_TARGETS[0]], copy, env=env)
            secs = time.monotonic() - t0
            if r.returncode != 0 or "1 passed, 0 failed" not in r.stdout:
                sys.exit(f"mutate: {name} does not pass when run alone (TG_TEST_ONLY={name}), so "
                         f"which lines it reaches cannot be told:\n{r.stdout[-3000:]}")
            counted = []
            for note in notes:
                data = os.path.join(prefix, note[:-len(".gcno")] + ".gcda")
                if os.path.exists(data):
                    os.link(os.path.join(objdir, note), os.path.join(prefix, note))
                    counted.append(data)
            reached, executable = {}, {}
            if counted:
                g = run(["gcov", "--json-format", "--stdout"] + counted, copy)
                if g.returncode != 0:
                    sys.exit(f"mutate: gcov failed for {name}:\n{g.stdout[-3000:]}")
                decoder, text, at = json.JSONDecoder(), g.stdout, 0
                while True:
                    while at < len(text) and text[at] != "{":
                        at += 1  # gcov's notes (a source newer than its notes...) between documents
                    if at >= len(text):
                        break
                    doc, at = decoder.raw_decode(text, at)
                    for f in doc.get("files", []):
                        path = os.path.normpath(f["file"])
                        if path not in wanted:
                            continue
                        executable.setdefault(path, set()).update(l["line_number"] for l in f["lines"])
                        reached.setdefault(path, set()).update(l["line_number"] for l in f["lines"] if l["count"] > 0)
            shutil.rmtree(prefix, ignore_errors=True)
            with lock:
                mapped[0] += 1
                if mapped[0] % 100 == 0:
                    log(f"mutate: {mapped[0]} of {len(self.tests)} tests mapped")
                self.seconds[index] = round(secs, 2)
                for path, lines in executable.items():
                    self.executable.setdefault(path, set()).update(lines)
                for path, lines in reached.items():
                    table = self.reached.setdefault(path, {})
                    for n in lines:
                        table.setdefault(n, []).append(index)

        t0 = time.monotonic()
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            list(pool.map(one, range(len(self.tests))))
        for table in self.reached.values():
            for tests in table.values():
                tests.sort()
        shutil.rmtree(scratch, ignore_errors=True)
        log(f"mutate: test map made in {time.monotonic() - t0:.0f} s")
        self.save()

    def tests_for(self, path, line, original):
        """The tests to run for a mutant of path:line (None: the whole suite) and their time alone."""
        if re.match(r"\s*(case\b|default\s*:)", original) or line not in self.executable.get(path, ()):
            return None, None
        reached = self.reached.get(path, {}).get(line)
        if not reached:
            return None, None
        return [self.tests[i] for i in reached], sum(self.seconds[i] for i in reached)


def prepare(root, out, jobs):
    workers = [Worker(root, out, i + 1) for i in range(jobs)]
    for w in workers:
        w.sync()
    first = workers[0]
    log(f"mutate: building {first.dir}/build")
    built = first.make(parallel=jobs)
    if built.returncode != 0:
        sys.exit(f"mutate: the unmutated tree does not build in {first.dir}:\n{built.stdout[-3000:]}")
    for w in workers[1:]:
        if not os.path.isdir(os.path.join(w.dir, "build")):
            shutil.copytree(os.path.join(first.dir, "build"), os.path.join(w.dir, "build"), symlinks=True)
        built = w.make()
        if built.returncode != 0:
            sys.exit(f"mutate: the unmutated tree does not build in {w.dir}:\n{built.stdout[-3000:]}")
    return workers


def unmutated_suite_seconds(out, workers, key):
    """The unmutated suite's time under the load of every worker running at once (as a
    mutant's suite shares the machine): the suite's tests are dealt out to the workers, all
    must pass, and the time is the sum of their shares' times, what one worker would take
    for the whole suite. Kept in OUT/suite-time.json for the tree, build and number of
    workers, so that a continued run does not time it again."""
    path = os.path.join(out, SUITE_TIME)
    try:
        with open(path) as f:
            saved = json.load(f)
    except (OSError, ValueError):
        saved = {}
    if key in saved:
        return saved[key]
    first = workers[0]
    listed = subprocess.run(["./" + TARGETS[0]], cwd=first.dir, env=dict(os.environ, TG_TEST_LIST="1"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace")
    tests = [m.group(1) for m in re.finditer(r"^(\w+) \S+\.c$", listed.stdout, re.M)]
    if listed.returncode != 0 or not tests:
        sys.exit(f"mutate: listing the tests failed:\n{listed.stdout[-2000:]}{listed.stderr[-2000:]}")
    shares = [tests[i::len(workers)] for i in range(len(workers))]
    log(f"mutate: running the unmutated suite's {len(tests)} tests, dealt out to {len(workers)} worker(s), "
        f"for the time limit")
    with ThreadPoolExecutor(max_workers=len(workers)) as pool:
        runs = list(pool.map(lambda ws: ws[0].suite(None, (), ws[1]), zip(workers, shares)))
    for (rc, _, output, _), share in zip(runs, shares):
        if rc != 0 or f"{len(share)} passed, 0 failed" not in output:
            sys.exit(f"mutate: the unmutated suite fails; a score would mean nothing:\n{output[-3000:]}")
    saved[key] = round(sum(r[3] for r in runs), 1)
    with open(path + ".tmp", "w") as f:
        json.dump(saved, f, indent=1)
    os.replace(path + ".tmp", path)
    return saved[key]


def score(killed, survived):
    return f"{100.0 * killed / (killed + survived):5.1f}%" if killed + survived else "    -"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--mutants", type=int, default=300)
    ap.add_argument("--seed", default="1")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--files", default="", help="shell globs of the paths to mutate, space-separated")
    ap.add_argument("--sanitize", action="store_true",
                    help="run the mutants against the AddressSanitizer/UBSan build of the suite")
    ap.add_argument("--whole-suite", action="store_true",
                    help="run every mutant against the whole suite, not only the tests that reach its line")
    ap.add_argument("--confirm-survivors", action="store_true",
                    help="run each mutant that the tests reaching its line spared against the whole suite too")
    ap.add_argument("--stop-after", type=float, default=0,
                    help="hand out no more mutants after this many seconds (0: run them all)")
    a = ap.parse_args()
    started = time.monotonic()
    global TARGETS
    if a.sanitize:
        TARGETS = SANITIZED_TARGETS
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, stop_suites)
    root, out = os.path.abspath(a.root), os.path.abspath(a.out)
    # One run at a time in OUT: two would edit the same worker copies under each other.
    os.makedirs(out, exist_ok=True)
    # (scripts/mutate.sh takes the lock itself, before it touches the venv there.)
    if os.environ.get("TG_MUTATE_LOCKED") != "1":
        lock_file = open(os.path.join(out, ".lock"), "w")
        try:
            fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            sys.exit(f"mutate: another run is using {out}; wait for it or stop it first")
    jobs = max(1, a.jobs)
    globs = a.files.split()

    files = cpu_sources(root, globs)
    if not files:
        sys.exit(f"mutate: no CPU source matches FILES={a.files!r}")
    table = generate(root, files)
    total = sum(len(m) for _, m in table.values())
    chosen, orders = sample(table, a.mutants, a.seed)
    drawn = {p: sum(1 for c in chosen if c[0] == p) for p in orders}
    equivalent = load_equivalent(root)
    log(f"mutate: {total} mutants of {len(files)} files; {len(chosen)} sampled with seed {a.seed}, "
        f"{jobs} worker(s)")

    todo, results = [], []
    for path, line, text in chosen:
        why = equivalent.get((path, line, text.strip()))
        if why:
            results.append({"file": path, "line": line, "original": table[path][0][line - 1], "mutant": text,
                            "status": "equivalent", "why": why})
        else:
            todo.append((path, line, text))
    stale = [k for k in equivalent if k[0] in table
             and not any(k[2] == t.strip() for ln, t in table.get(k[0], ([], []))[1] if ln == k[1])]

    workers = prepare(root, out, jobs)
    # What the workers test: the first copy as synced (the tree may change meanwhile).
    tree = tree_identity(workers[0].dir, workers[0].names) + ("+sanitized" if a.sanitize else "")
    base_secs = unmutated_suite_seconds(out, workers, f"{tree}:{jobs}")
    timeout = max(MIN_TIMEOUT_S, TIMEOUT_FACTOR * base_secs)
    log(f"mutate: unmutated suite {base_secs:.1f} s; a mutant's suite is stopped (killed) after {timeout:.0f} s")

    kill_order = KillOrder(root, out)
    cached = load_results(out, tree)
    test_map = None
    if not a.whole_suite:
        test_map = TestMap(out, tree.split("+")[0] + TestMap.VERSION)
        if not test_map.load():
            # Every CPU source, whatever FILES narrows: the map serves later runs of the tree too.
            test_map.build(workers[0], jobs, cpu_sources(root, []))
    results_log = open(os.path.join(out, RESULTS), "a")
    lock = threading.Condition()
    queue, busy, done, ran, reused = list(reversed(todo)), [0], [0], [], [0]

    def replacement(path):
        """The next mutant of path's order that is not listed as equivalent, or None."""
        order = orders[path]
        while drawn[path] < len(order):
            m = order[drawn[path]]
            drawn[path] += 1
            if not equivalent.get((m[0], m[1], m[2].strip())):
                return m
        return None

    def worker(w):
        while True:
            with lock:
                while not queue and busy[0]:
                    lock.wait()
                if not queue or (a.stop_after and time.monotonic() - started > a.stop_after):
                    lock.notify_all()
                    return
                item = queue.pop()
                busy[0] += 1
                first = kill_order.first(item[0])
                earlier = cached.get(item)
            if earlier:
                r = dict(earlier)
            else:
                only, alone = test_map.tests_for(item[0], item[1], table[item[0]][0][item[1] - 1]) \
                    if test_map else (None, None)
                limit = timeout if only is None else min(timeout, max(MIN_TIMEOUT_S, TIMEOUT_FACTOR * alone))
                r = w.evaluate(*item, limit, first, only)
                if a.confirm_survivors and only is not None and r["status"] == "survived":
                    # A check of the map: the whole suite must not kill what its tests spared.
                    whole = w.evaluate(*item, timeout, first, None)
                    r = dict(whole, map_missed=whole["status"] == "killed", seconds=r["seconds"] + whole["seconds"])
            with lock:
                busy[0] -= 1
                done[0] += 1
                ran.append(r)
                if earlier:
                    reused[0] += 1
                else:
                    results_log.write(json.dumps(dict(r, tree=tree)) + "\n")
                    results_log.flush()
                    if r["status"] == "killed":
                        kill_order.killed(r["file"], r["by"])
                by = f" ({r['by']})" if r.get("by") and r["status"] == "killed" else ""
                again = " (an earlier run's result)" if earlier else ""
                log(f"[{done[0]}] {r['file']}:{r['line']}: {r['status']}{by}, {r['seconds']:.1f} s{again}")
                if r["status"] == "invalid":
                    m = replacement(r["file"])
                    if m:
                        queue.append(m)
                lock.notify_all()

    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(worker, workers))
    results += ran
    kill_order.save()
    results_log.close()
    not_run = len(queue)
    wall = time.monotonic() - t0
    results.sort(key=lambda r: (r["file"], r["line"], r["mutant"]))

    per_file = {}
    for r in results:
        f = per_file.setdefault(r["file"], {"killed": 0, "survived": 0, "invalid": 0, "equivalent": 0})
        f[r["status"]] += 1
    totals = {k: sum(f[k] for f in per_file.values()) for k in ("killed", "survived", "invalid", "equivalent")}

    survivors = [r for r in results if r["status"] == "survived"]
    if survivors:
        log(f"\nsurvivors ({len(survivors)}):")
    for r in survivors:
        log(f"{r['file']}:{r['line']}:")
        src = table[r["file"]][0]
        lo, hi = max(0, r["line"] - 3), min(len(src), r["line"] + 2)
        mutated = src[lo:r["line"] - 1] + [r["mutant"]] + src[r["line"]:hi]
        diff = difflib.unified_diff(src[lo:hi], mutated, f"a/{r['file']}", f"b/{r['file']}", n=2)
        # difflib numbers hunks from the slice; the file's own line numbers are wanted.
        for d in diff:
            m = re.match(r"^@@ -(\d+)(,\d+)? \+(\d+)(,\d+)? @@", d)
            if m:
                d = (f"@@ -{int(m.group(1)) + lo}{m.group(2) or ''} "
                     f"+{int(m.group(3)) + lo}{m.group(4) or ''} @@\n")
            log("    " + d.rstrip("\n"))

    width = max([len(p) for p in per_file] + [5])
    log(f"\n{'file':<{width}}  killed  survived  invalid  equivalent   score")
    for p in sorted(per_file):
        f = per_file[p]
        log(f"{p:<{width}}  {f['killed']:6d}  {f['survived']:8d}  {f['invalid']:7d}  {f['equivalent']:10d}  "
            f"{score(f['killed'], f['survived'])}")
    log(f"{'TOTAL':<{width}}  {totals['killed']:6d}  {totals['survived']:8d}  {totals['invalid']:7d}  "
        f"{totals['equivalent']:10d}  {score(totals['killed'], totals['survived'])}")
    for k in stale:
        log(f"mutate: {EQUIVALENT_LIST}: {k[0]}:{k[1]} matches no mutant of the tree (stale entry)")
    confirmed = [r for r in ran if "map_missed" in r]
    if confirmed:
        missed = [r for r in confirmed if r["map_missed"]]
        log(f"mutate: {len(confirmed)} mutants spared by the tests reaching their line ran against the whole "
            f"suite too; it killed {len(missed)} of them" +
            "".join(f"\n    {r['file']}:{r['line']} (by {r['by']})" for r in missed))
    fresh = len(ran) - reused[0]
    per_mutant = wall * jobs / fresh if fresh else 0.0
    log(f"mutate: score {score(totals['killed'], totals['survived']).strip()} "
        f"(killed {totals['killed']} of {totals['killed'] + totals['survived']}); "
        f"{len(ran)} mutants run ({totals['invalid']} of them did not compile and were replaced; "
        f"{reused[0]} results taken from an earlier run) in {wall:.0f} s with {jobs} worker(s), "
        f"{per_mutant:.1f} s of a worker each; report in {os.path.join(a.out, 'report.json')}")
    if not_run:
        log(f"mutate: PARTIAL: {not_run} sampled mutants not run (--stop-after {a.stop_after:g}); "
            f"the same command again continues the run")

    report = {
        "seed": a.seed, "sanitized": a.sanitize, "requested": a.mutants, "sampled": len(chosen), "generated": total,
        "files": files, "jobs": jobs, "rules": RULES,
        "universalmutator": getattr(mutator, "__version__", None) or _version(),
        "unmutated_suite_seconds": round(base_secs, 1), "timeout_seconds": round(timeout),
        "wall_seconds": round(wall, 1), "worker_seconds_per_mutant": round(per_mutant, 1),
        "tree": tree, "reused": reused[0], "not_run": not_run,
        "totals": dict(totals, score=(totals["killed"] / (totals["killed"] + totals["survived"])
                                      if totals["killed"] + totals["survived"] else None)),
        "per_file": per_file, "stale_equivalent_entries": [f"{k[0]}:{k[1]}" for k in stale],
        "mutants": results,
    }
    with open(os.path.join(out, "report.json"), "w") as f:
        json.dump(report, f, indent=1)
        f.write("\n")


def _version():
    try:
        from importlib.metadata import version
        return version("universalmutator")
    except Exception:
        return None


if __name__ == "__main__":
    main()
