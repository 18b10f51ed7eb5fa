"""Wall time of a Flickr8k-size evaluation (1000 images x 5000 captions, k=49 grid regions) through
``vlmatch evaluate``, in one process and sharded over torchrun processes.

    python benchmarks/shard_eval.py                     # CAAN (IA+SA), D=256, m=32: the Flickr8k config
    python benchmarks/shard_eval.py --model scan_t2i_avg --extra embed_dim=256

Synthetic features by default: random 1280-d grid features and captions of 8-16 words drawn from a
1000-word vocabulary; ``--data $VLMATCH_CACHE/flickr8k-efficientnet-lite0 --split dev`` uses the real
Flickr8k val features and captions. A freshly initialised model (scoring cost does not depend on the
weights). Each run is a
whole ``vlmatch evaluate`` command (start-up, encoding, scoring, gathering, metrics), timed from
outside, with the user and system CPU time of its processes. The configurations use the same 2
cores: one process with 2 threads, one with 1 thread, 2 torchrun processes with 1 thread each.
Results: benchmarks/results/shard_eval.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from vlmatch_lab.paths import cache_root

HERE = Path(__file__).resolve().parent
RUNS = {
    "1 process x 2 threads": (1, 2),
    "1 process x 1 thread": (1, 1),
    "2 processes x 1 thread (torchrun)": (2, 1),
}


def make_world(root: Path, a) -> Path:
    from vlmatch import create_model
    from vlmatch.data.vocab import Vocab

    ck = root / f"ck_{a.model}"
    if a.data:  # real features: the vocabulary of the training captions, the split as it is
        from vlmatch.data.precomp import PrecompSplit

        sp = PrecompSplit(Path(a.data), a.split)
        a.images, a.k, a.img_dim = sp.n_images, sp.n_regions, sp.img_dim
        vocab = Vocab.build(PrecompSplit(Path(a.data), "train").captions, 4)
        data = Path(a.data)
    else:
        data = root / "data"
        rng = np.random.default_rng(0)
        words = [f"w{i}" for i in range(1000)]
        caps = [" ".join(rng.choice(words, size=rng.integers(8, 17))) for _ in range(5 * a.images)]
        data.mkdir(parents=True, exist_ok=True)
        np.save(data / "test_ims.npy", rng.standard_normal((a.images, a.k, a.img_dim), dtype=np.float32))
        (data / "test_caps.txt").write_text("\n".join(caps) + "\n")
        vocab = Vocab.build(caps, 1)
    extra = dict(kv.split("=") for kv in a.extra)
    extra = {k: int(v) if v.isdigit() else v for k, v in extra.items()}
    torch.manual_seed(0)
    model = create_model(a.model, img_dim=a.img_dim, vocab_size=len(vocab), **extra)
    model.vocab = vocab
    model.save(ck)
    return ck, data


def run(procs: int, threads: int, ck: Path, data: Path, out: Path, a) -> dict:
    cli = ["-m", "vlmatch.cli", "evaluate", "--checkpoint", str(ck), "--data", str(data), "--split", a.split,
           "--save-sims", str(out), "--json", str(out.with_suffix(".json")), "--no-progress"]
    if procs > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={procs}", *cli]
    else:
        cmd = [sys.executable, *cli]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        sys.exit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return {"wall_s": wall, "user_s": r1.ru_utime - r0.ru_utime, "sys_s": r1.ru_stime - r0.ru_stime,
            "rsum": json.loads(out.with_suffix(".json").read_text())["rsum"], "command": " ".join(cmd[1:])}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="caan")
    ap.add_argument("--extra", nargs="*", default=["embed_dim=256", "attn_dim=32"], metavar="KEY=VALUE")
    ap.add_argument("--images", type=int, default=1000)
    ap.add_argument("--k", type=int, default=49)
    ap.add_argument("--img-dim", type=int, default=1280)
    ap.add_argument("--data", help="a precomp folder with real features (default: synthetic ones)")
    ap.add_argument("--split", default="test")
    ap.add_argument("--runs", nargs="+", default=list(RUNS), metavar="RUN")
    ap.add_argument("--note", default="")
    ap.add_argument("--work", default=str(cache_root() / "shard_eval"))
    ap.add_argument("--out", default=str(HERE / "results" / "shard_eval"))
    a = ap.parse_args(argv)
    work = Path(a.work)
    ck, data = make_world(work, a)
    res, mats = {}, {}
    for name in a.runs:
        procs, threads = RUNS[name]
        out = work / f"sims_{procs}x{threads}.npy"
        res[name] = run(procs, threads, ck, data, out, a)
        mats[name] = np.load(out)
        print(f"{name:34s} wall {res[name]['wall_s']:7.1f} s  (user {res[name]['user_s']:.1f} s, "
              f"sys {res[name]['sys_s']:.1f} s)", flush=True)
    ref = mats.get("1 process x 1 thread", next(iter(mats.values())))  # same threads per process as torchrun's
    same = {name: bool(np.array_equal(m, ref)) for name, m in mats.items()}
    from harness import write_report

    from vlmatch_lab.host import host

    report = {"host": host(a.note), "model": a.model, "extra": a.extra, "data": a.data or "synthetic", "split": a.split,
              "shape": {"images": a.images, "captions": 5 * a.images, "k": a.k,
              "img_dim": a.img_dim}, "runs": res, "bit_identical_to_1x1": same, "note": a.note,
              "torch": torch.__version__, "command": "python benchmarks/shard_eval.py " + " ".join(
                  argv if argv is not None else sys.argv[1:])}

    write_report(a.out, report, render)


def render(r: dict) -> str:
    sh = r["shape"]
    lines = [f"# Sharded evaluation: {r['model']} ({', '.join(r['extra'])}), {sh['images']} x {sh['captions']}, "
             f"k={sh['k']}", "",
             "Whole `vlmatch evaluate` commands (start-up, encoding, scoring, gathering, metrics) on "
             f"{r['data']} {sh['img_dim']}-d features ({r['split']} split), freshly initialised model, timed from "
             f"outside; torch {r['torch']}, 2 cores.", ""]
    if r.get("note"):
        lines += [r["note"], ""]
    lines += ["| run | wall (s) | user CPU (s) | system CPU (s) | matrix bit-identical to 1 process x 1 thread |",
              "|---|---|---|---|---|"]
    for name, x in r["runs"].items():
        lines.append(f"| {name} | {x['wall_s']:.1f} | {x['user_s']:.1f} | {x['sys_s']:.1f} | "
                     f"{'yes' if r['bit_identical_to_1x1'][name] else 'no'} |")
    lines += ["", f"Command: `{r['command']}`", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
