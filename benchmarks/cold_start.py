"""Cold start of the command line (issue #50): each command's wall time from a fresh interpreter, and where
it goes.

    python benchmarks/cold_start.py                           # this checkout, label "after"
    python benchmarks/cold_start.py --src /tmp/old/src --label before   # an older checkout (git worktree add)

Commands timed (N fresh processes each, default 5; min / median / max of the wall time):
  help     ``vlmatch --help``                                   goal <= 0.5 s
  argerror ``vlmatch search IDX text -k x`` (argparse refuses)  no torch imported (tests/cli/test_cold_start.py)
  search   ``vlmatch search IDX "a dog runs on the grass"``     goal <= 2 s on a 1,000-photo index
  explain  ``vlmatch explain --index IDX --id 3 --text ...``    goal <= 3 s
With ``VLMATCH_PROFILE=1`` the command prints its own split on stderr (import, load, encode, search /
explain, render: vlmatch.cli.common.Phases); ``startup`` is the wall time less those phases (interpreter,
vlmatch's own imports, exit). The index is ``$VLMATCH_CACHE/index1000``: built once, when missing, with
``vlmatch index build`` (the shipped default model) from the first 1,000 Flickr8k val photos. Each label's
figures are kept in the results file, so "before" and "after" sit side by side; take both on the same
quiet host (the machine's other load changes every figure).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import write_report

from vlmatch_lab.host import cpu_flags, cpu_model
from vlmatch_lab.paths import cache_root, data_root

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "cold_start"
CACHE = cache_root()  # $VLMATCH_CACHE
INDEX = CACHE / "index1000"
SHARED = data_root(check=False) / "flickr8k"  # $VLMATCH_DATA/flickr8k: the photos and Karpathy captions
QUERY = "a dog runs on the grass"
GOALS = {"help": 0.5, "search": 2.0, "explain": 3.0}
# measured by the issue (2 cores, nothing else running, median of 5), before this work
ISSUE_BEFORE = {"help": 1.99, "search": 6.13}
PROFILE = re.compile(r"^vlmatch: profile: (.*)$", re.M)


def commands(index: Path, out_png: Path) -> dict[str, list[str]]:
    return {"help": ["--help"], "argerror": ["search", str(index), "text", "-k", "x"],
            "search": ["search", str(index), QUERY],
            "explain": ["explain", "--index", str(index), "--id", "3", "--text", QUERY, "--out", str(out_png)]}


def parse_profile(stderr: str) -> dict[str, float]:
    """The phases of a ``vlmatch: profile: import 0.9 s, load 0.3 s, ...`` line (empty without one)."""
    m = PROFILE.search(stderr)
    if not m:
        return {}
    out = {}
    for part in m.group(1).split(", "):
        name, value, _ = part.rsplit(" ", 2)
        out[name] = float(value)
    return out


def time_command(src: Path, argv: list[str], runs: int, expect: int = 0) -> dict:
    """``runs`` fresh ``python -m vlmatch.cli ARGV`` with ``src`` first on the path: wall times and phases. A run
    that exits other than ``expect`` stops the benchmark (a failing command is timed as fast as its error)."""
    env = {**os.environ, "PYTHONPATH": str(src), "VLMATCH_PROFILE": "1"}
    walls, phases, codes = [], [], set()
    for _ in range(runs):
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-m", "vlmatch.cli", *argv], env=env, capture_output=True, text=True)
        walls.append(time.perf_counter() - t0)
        codes.add(p.returncode)
        phases.append(parse_profile(p.stderr))
        if p.returncode != expect:
            last = (p.stderr.strip().splitlines() or ["(no output)"])[-1]
            sys.exit(f"cold_start.py: `vlmatch {' '.join(argv)}` exited {p.returncode}: {last}")
    names = list(dict.fromkeys(k for ph in phases for k in ph if k != "total"))
    split = {k: statistics.median(ph.get(k, 0.0) for ph in phases) for k in names}
    med = statistics.median(walls)
    if split:
        split = {"startup": max(0.0, med - sum(split.values())), **split}
    return {"argv": argv, "runs": runs, "exit_codes": sorted(codes), "median_s": med, "min_s": min(walls),
            "max_s": max(walls), "walls_s": walls, "split_s": split}


def ensure_index(index: Path) -> None:
    """The 1,000-photo index (the first 1,000 Flickr8k val photos, the shipped default pair), built once."""
    if (index / "manifest.json").is_file():
        return
    data = json.loads((SHARED / "dataset_flickr8k.json").read_text())
    photos = CACHE / "photos1000"
    photos.mkdir(parents=True, exist_ok=True)
    for name in [im["filename"] for im in data["images"] if im["split"] == "val"][:1000]:
        if not (photos / name).exists():
            (photos / name).symlink_to((SHARED / "images" / name).resolve())
    subprocess.run([sys.executable, "-m", "vlmatch.cli", "index", "build", "--images", str(photos), "--out", str(index),
                    "--no-progress"], check=True)


def _rev(src: Path) -> str:
    """The commit of the checkout ``src`` lies in, with ``+changes`` when it has uncommitted ones ('' if none)."""
    try:
        rev = subprocess.run(["git", "-C", str(src), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(src), "status", "--porcelain", "."], capture_output=True,
                               text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""
    return rev + ("+changes" if dirty else "")


def render(rep: dict) -> str:
    lines = ["# Cold start of the command line", "",
             "Wall time of one command in a fresh interpreter (`python -m vlmatch.cli ...`), N runs each, and where the "
             "median goes (`VLMATCH_PROFILE=1`: `startup` = interpreter, vlmatch's imports and exit; `import` = torch and "
             "the command's modules; `load` = the checkpoint(s); `encode` = the query; `search` = both stages). "
             f"Index: {rep.get('index_photos', 1000)} Flickr8k val photos, the shipped default model. Command: "
             "`python benchmarks/cold_start.py [--src OLD/src --label before]`.", "",
             f"Host: {rep['host']['cpu']}, {rep['host'].get('cores', '?')} cores, "
             f"flags {' '.join(rep['host'].get('flags', []))}.", "",
             "| label | command | median s | min s | max s | goal s | split of the median (s) |",
             "|---|---|---:|---:|---:|---:|---|"]
    for label, res in rep["labels"].items():
        for name, r in res["commands"].items():
            split = ", ".join(f"{k} {v:.2f}" for k, v in r["split_s"].items()) or "-"
            goal = GOALS.get(name)
            lines.append(f"| {label} | {name} | {r['median_s']:.2f} | {r['min_s']:.2f} | {r['max_s']:.2f} | "
                         f"{goal if goal else '-'} | {split} |")
    lines += ["", "Measured by the issue before this work (2 cores, nothing else running, median of 5): "
              + ", ".join(f"{k} {v} s" for k, v in rep["issue_before"].items()) + ".", ""]
    for label, res in rep["labels"].items():
        env = ", ".join(f"{k}={v}" for k, v in res.get("threads_env", {}).items()) or "default threads"
        lines.append(f"- {label}: {res['when']}, vlmatch {res.get('rev') or res['src']}, {env}, nice "
                     f"{res.get('niceness', 0)}; {res['note']}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", default=str(HERE.parent / "src"), help="the vlmatch source folder to time (default: "
                                                                   "this checkout's)")
    ap.add_argument("--label", default="after", help="the name these figures are kept under (before / after)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--index", default=str(INDEX))
    ap.add_argument("--only", nargs="+", choices=["help", "argerror", "search", "explain"])
    ap.add_argument("--note", default="", help="what else the host was doing (recorded)")
    ap.add_argument("--rev", default="", help="the commit --src was taken from (recorded)")
    ap.add_argument("--out", default=str(RESULTS))
    a = ap.parse_args(argv)
    index = Path(a.index)
    ensure_index(index)
    with tempfile.TemporaryDirectory() as tmp:
        cmds = commands(index, Path(tmp) / "explain.png")
        res = {name: time_command(Path(a.src), cmd, a.runs, expect=2 if name == "argerror" else 0)  # argparse refuses
               for name, cmd in cmds.items() if not a.only or name in a.only}
    for name, r in res.items():
        split = ", ".join(f"{k} {v:.2f}" for k, v in r["split_s"].items())
        print(f"{a.label:7s} {name:9s} median {r['median_s']:.2f} s (min {r['min_s']:.2f}, max {r['max_s']:.2f})  {split}")
    out = Path(a.out)
    old = json.loads(out.with_suffix(".json").read_text()) if out.with_suffix(".json").is_file() else {}
    labels = old.get("labels", {})
    labels[a.label] = {"src": a.src, "rev": a.rev or _rev(Path(a.src)), "when": time.strftime("%Y-%m-%d %H:%M"),
                       "note": a.note or "no note", "niceness": os.nice(0),
                       "threads_env": {k: os.environ[k] for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS") if k in os.environ},
                       "commands": res}
    rep = {"benchmark": "cold_start", "host": {"cpu": cpu_model(), "cores": os.cpu_count(), "flags": cpu_flags()},
           "index_photos": 1000, "query": QUERY, "goals_s": GOALS, "issue_before": ISSUE_BEFORE, "labels": labels}
    write_report(out, rep, render)
    return rep


if __name__ == "__main__":
    main()
