"""Roofline of every model's pair scoring: µs per (image, caption) pair against its compute bound.

    python benchmarks/roofline.py                  # k=36 regions, L=12 words, 1 thread
    python benchmarks/roofline.py --threads 2

Each model declares the unavoidable work of its ``score`` per pair, counted from its equations
(``MatchingModel.pair_flops``: multiply-adds and transcendentals). The bound is that work at this
machine's peaks, measured in the same run, each in its own process: a plain float32 GEMM
(2048 x 1024 @ 1024 x 2048) for the multiply-adds and ``torch.tanh`` over a cache-sized contiguous
tensor for the transcendentals:

    bound µs/pair = 2 macs / GEMM FLOP/s + transcendentals / transcendental rate

(the transcendental rate is the fastest of aten's tanh, a compiled tanh and aten's sigmoid: tanh(x) =
2σ(2x) - 1, and on this CPU aten's sigmoid is ~10x faster than its tanh)

Each model is timed through the engine (``score_blocks``, the engine's own block plan) on encodings of
random features and random tokens, eager and with ``compile=True`` (compilation not timed).
A model family joins the table with one entry in ``MODELS`` and a ``pair_flops`` method.
Results: benchmarks/results/roofline.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent

# family label -> (registered name, overrides). Sizes are the registered (paper) ones unless given.
MODELS = {
    "VSE++": ("vsepp", {}),
    "SCAN t-i AVG": ("scan_t2i_avg", {}),
    "SCAN i-t AVG": ("scan_i2t_avg", {}),
    "CAAN (IA+SA)": ("caan", {"attn_dim": 256}),
    "SMAN": ("sman", {}),
    "MTFN": ("mtfn", {}),
    "MMCA": ("mmca", {}),
}


def _timed(fn, min_seconds: float) -> tuple[float, int]:
    """Seconds and repetitions of ``fn`` run until at least ``min_seconds`` have passed."""
    reps, t0 = 0, time.perf_counter()
    while True:
        fn()
        reps += 1
        dt = time.perf_counter() - t0
        if dt >= min_seconds:
            return dt, reps


def measure_peaks(a) -> dict:
    torch.set_num_threads(a.threads[0])
    x, y = torch.randn(2048, 1024), torch.randn(1024, 2048)
    out = torch.empty(2048, 2048)
    torch.mm(x, y, out=out)
    dt, reps = _timed(lambda: torch.mm(x, y, out=out), a.min_seconds)
    gemm = 2 * 2048 * 1024 * 2048 * reps / dt
    t = torch.randn(64, 4096)  # 1 MiB: stays in cache, as a fused elementwise kernel's operand would
    tout = torch.empty_like(t)
    dt, reps = _timed(lambda: torch.tanh(t, out=tout), a.min_seconds)
    eager = t.numel() * reps / dt
    # a compiled model's fused kernels evaluate tanh / exp / sigmoid with their own vectorised code,
    # which can beat aten's: the bound takes the faster of the two, so no model runs "below" it
    fused = torch.compile(lambda x: torch.tanh(x) * 1.0)
    fused(t)
    dt, reps = _timed(lambda: fused(t), a.min_seconds)
    compiled = t.numel() * reps / dt
    # tanh(x) = 2 sigmoid(2x) - 1: a tanh is never dearer than a sigmoid and two multiply-adds
    dt, reps = _timed(lambda: torch.sigmoid(t, out=tout), a.min_seconds)
    sigmoid = t.numel() * reps / dt
    return {"gemm_flops": gemm, "tanh_per_s": max(eager, compiled, sigmoid), "tanh_eager_per_s": eager,
            "tanh_compiled_per_s": compiled, "sigmoid_per_s": sigmoid}


def measure_model(name: str, compiled: bool, a, before: bool = False) -> dict:
    from vlmatch import create_model
    from vlmatch.evaluation.scoring import BlockPlan, score_blocks
    from vlmatch.models.attention import cross_sim

    torch.set_num_threads(a.threads[0])
    torch.manual_seed(0)
    label_name, overrides = MODELS[name]
    model = create_model(label_name, vocab_size=1000, **overrides).eval()
    plan = BlockPlan.for_budget(model, 10**6, 10**6, a.k, a.L)
    n_img, n_cap = min(plan.images, a.max_images), min(plan.captions, a.max_captions)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        img = model.encode_images(torch.randn(n_img, a.k, model.cfg.img_dim, generator=g), None)
        tokens = torch.randint(1, 1000, (n_cap, a.L), generator=g)
        txt = model.encode_texts(tokens, torch.full((n_cap,), a.L))
    chunks = [(np.arange(n_cap), txt)]

    def run():
        return score_blocks(model, img, chunks, n_cap, n_img, progress=False, compile=compiled)

    if before:  # before: the training form, run without autograd
        def run():  # noqa: F811
            with torch.no_grad():
                f, g = model._weights(img, txt.trim())
                return model._cosine(img, txt.trim(), f, g).numpy()
    d = model.cfg.embed_dim
    rv = torch.nn.functional.normalize(torch.randn(n_img, a.k, d, generator=g), dim=-1)
    re = torch.nn.functional.normalize(torch.randn(n_cap, a.L, d, generator=g), dim=-1)
    cross_sim(rv, re)
    gdt, greps = _timed(lambda: cross_sim(rv, re), a.min_seconds / 2)

    t0 = time.perf_counter()
    first = run()  # warm-up (and compilation)
    warm = time.perf_counter() - t0
    assert np.isfinite(first).all()
    dt, reps = _timed(run, a.min_seconds)
    return {"us_per_pair": 1e6 * dt / (reps * n_img * n_cap), "block": [n_img, n_cap], "first_call_s": warm,
            "gemm_us_per_pair": 1e6 * gdt / (greps * n_img * n_cap),
            "pair_flops": model.pair_flops(a.k, a.L),
            "sizes": {k: v for k, v in vars(model.cfg).items() if k in ("embed_dim", "attn_dim")}}


def _child(args: list[str]) -> dict:
    out = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"{' '.join(args)} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--k", type=int, default=36, help="regions per image")
    ap.add_argument("--L", type=int, default=12, help="words per caption")
    ap.add_argument("--threads", type=int, nargs="+", default=[1], help="one table row per family and count")
    ap.add_argument("--no-compiled", action="store_true", help="eager only (no torch.compile column)")
    ap.add_argument("--before", nargs="*", default=[], metavar="FAMILY",
                    help="also time these families' autograd form without autograd (CAAN's form before caan_block)")
    ap.add_argument("--min-seconds", type=float, default=2.0, help="time each measurement at least this long")
    ap.add_argument("--max-images", type=int, default=512, help="cap of the timed slice (one engine block row)")
    ap.add_argument("--max-captions", type=int, default=1024)
    ap.add_argument("--models", nargs="+", default=list(MODELS), metavar="FAMILY")
    ap.add_argument("--note", default="", help="free text recorded with the results (e.g. machine load)")
    ap.add_argument("--out", default=str(HERE / "results" / "roofline"))
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        torch.set_num_threads(a.threads[0])
        res = measure_peaks(a) if a.child[0] == "peaks" else measure_model(a.child[0], a.child[1] == "compiled", a,
                                                                               a.child[1] == "before")
        print(json.dumps(res))
        return
    from harness import ratio_to_bound, write_report

    from vlmatch_lab.host import host

    rows, all_peaks = {}, {}
    for threads in a.threads:
        common = [f"--k={a.k}", f"--L={a.L}", f"--threads={threads}", f"--min-seconds={a.min_seconds}",
                  f"--max-images={a.max_images}", f"--max-captions={a.max_captions}"]
        peaks = all_peaks[threads] = _child(common + ["--child", "peaks"])
        print(f"{threads} thread(s): GEMM peak {peaks['gemm_flops'] / 1e9:.1f} GFLOP/s, "
              f"tanh {peaks['tanh_per_s'] / 1e9:.2f} G/s", flush=True)
        for fam in a.models + [f"{f} before" for f in a.before]:
            base = fam.removesuffix(" before")
            modes = ["before"] if fam != base else ["eager"] + ([] if a.no_compiled else ["compiled"])
            r = {mode: _child(common + ["--child", base, mode]) for mode in modes}
            e = r[modes[0]]
            pf = e["pair_flops"]
            bound = 1e6 * (2 * pf["macs"] / peaks["gemm_flops"] + pf["transcendentals"] / peaks["tanh_per_s"])
            x = rows[f"{fam} @{threads}"] = {
                "family": fam, "threads": threads, "model": MODELS[base][0], "sizes": e["sizes"], "macs": pf["macs"],
                "transcendentals": pf["transcendentals"], "bound_us": bound, "block": e["block"],
                "gemm_us": e["gemm_us_per_pair"], "eager_us": e["us_per_pair"],
                "eager_ratio": ratio_to_bound(e["us_per_pair"], bound),
                "gemm_ratio": e["us_per_pair"] / e["gemm_us_per_pair"],
                "seconds_1000x5000": e["us_per_pair"] * 5e6 / 1e6}
            if "compiled" in r:
                x.update(compiled_us=r["compiled"]["us_per_pair"], compile_s=r["compiled"]["first_call_s"],
                         compiled_ratio=ratio_to_bound(r["compiled"]["us_per_pair"], bound))
            print(f"{fam:22s} {threads}t bound {bound:8.3f} µs  gemm {x['gemm_us']:7.3f}  eager {x['eager_us']:8.3f} "
                  f"({x['eager_ratio']:.1f}x bound, {x['gemm_ratio']:.1f}x gemm)", flush=True)
    report = {"shape": {"k": a.k, "L": a.L}, "threads": a.threads, "peaks": all_peaks, "models": rows,
              "torch": torch.__version__, "cpu": platform.processor() or platform.machine(), "note": a.note,
              "host": host(a.note),  # the harness's record: CPU model and vector flags, cores, threads
              "command": "python benchmarks/roofline.py " + " ".join(argv if argv is not None else sys.argv[1:])}

    write_report(a.out, report, render)


def render(r: dict) -> str:
    h = r.get("host", {})
    peaks = "; ".join(f"{t} thread(s): float32 GEMM {p['gemm_flops'] / 1e9:.1f} GFLOP/s, {p['tanh_per_s'] / 1e9:.2f} G/s "
                      f"transcendentals" for t, p in r["peaks"].items())
    lines = ["# Roofline: µs per (image, caption) pair against each model's region-word GEMM and arithmetic bound", "",
             f"k={r['shape']['k']} regions, L={r['shape']['L']} words; torch {r['torch']}; {h.get('cpu', r['cpu'])}, "
             f"{h.get('cores')} cores, flags: {' '.join(h.get('flags', []))}. All rows in one run, each in its own "
             f"process. Peaks measured in the same run: {peaks} (the fastest of aten's tanh, a compiled tanh and "
             "aten's sigmoid, since tanh(x) = 2σ(2x) - 1). Arithmetic bound = 2·MACs / GEMM peak + transcendentals / "
             "that rate, with each model's own count of its equations (`pair_flops`). GEMM = the bare region-word "
             "GEMM (`cross_sim`, float32) of the same block at the model's D, timed in the same process. Timed through "
             "the engine at its own block plan (`BlockPlan.for_budget`); 1000x5000 = µs/pair x 5 M pairs "
             "(extrapolated). A row '... before' is that family's training (autograd) form run without autograd: "
             "CAAN's scoring before `caan_block`.", ""]
    if r.get("note"):
        lines += [r["note"], ""]
    compiled = any("compiled_us" in x for x in r["models"].values())
    head = ("| model | threads | sizes | MACs/pair | transc./pair | block | GEMM µs/pair | bound µs/pair | µs/pair "
            "| / GEMM | / bound | 1000x5000 (s) |")
    lines += [head + (" compiled µs/pair | compiled / bound |" if compiled else ""),
              "|" + "---|" * (12 + 2 * compiled)]
    for x in r["models"].values():
        sizes = ", ".join(f"{k}={v}" for k, v in x["sizes"].items())
        row = (f"| {x['family']} (`{x['model']}`) | {x['threads']} | {sizes} | {x['macs']:,} | {x['transcendentals']:,} "
               f"| {x['block'][0]}x{x['block'][1]} | {x['gemm_us']:.3f} | {x['bound_us']:.3f} | {x['eager_us']:.3f} "
               f"| {x['gemm_ratio']:.1f}x | {x['eager_ratio']:.1f}x | {x['seconds_1000x5000']:.0f} |")
        if compiled:
            row += (f" {x['compiled_us']:.3f} | {x['compiled_ratio']:.1f}x |" if "compiled_us" in x else " - | - |")
        lines.append(row)
    lines += ["", f"Command: `{r['command']}`", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
