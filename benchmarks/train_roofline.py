"""Training roofline: one training step of every model family at its Flickr8k config, in ms, against its
compute bound, for the paper's recurrent text side (``gru``) and the frozen, cached all-MiniLM-L6-v2
(``minilm``).

    python benchmarks/train_roofline.py                    # every family, both text sides, 2 threads
    python benchmarks/train_roofline.py --families vsepp scan_t2i --text minilm

A step is what the trainer does per batch: encode the batch's images and captions, score the B x B
matrix, the model's own loss (hardest negatives), backward, gradient clipping and the optimizer step.
Inputs are the config's batch size of real Flickr8k captions (the first ones of the Karpathy train
split, tokenised by the model) and random 7 x 7 x 1280 grids (the EfficientNet-Lite0 shape); with
``minilm`` the captions' transformer outputs are put in the disk cache first (as the trainer's prefill
does), so a step reads them with one gather, exactly the training path.

Bound = (3 x forward multiply-adds x 2 FLOP) / GEMM peak + forward transcendentals / transcendental rate,
both peaks measured in this run with the step's thread count (see benchmarks/roofline.py). Forward
multiply-adds = the encoders' (every matrix product of encode_images + encode_texts, the recurrent
layers' included, counted by torch's FlopCounterMode) + the model's own ``batch_score_flops`` (B^2 x
``pair_flops`` unless training needs another form of the equations, as MTFN's rank fusion does; its
equations' count). Transcendentals = B^2 x the pair count + the recurrent gates' sigmoid / tanh
(counted from the layers' sizes).
Minutes per epoch = ms per step x steps per epoch (30,000 captions / the config's batch).
``--compile`` also times every step as ``train.compile: true`` runs it (torch.compile of the model's pair
score, shapes dynamic); the first step, which compiles, is reported apart (``compile_s``).
Memory: steps run as training runs them, with freed memory kept for the next step
(``train.reuse_freed_memory``, vlmatch.training.allocator); ``--system-allocator`` measures glibc's default
instead (large blocks mapped and unmapped every step), into ``train_roofline_system_allocator.{json,md}``.
Results: benchmarks/results/train_roofline.{json,md}, with this host's CPU flags.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from vlmatch_lab.host import cpu_flags, cpu_model
from vlmatch_lab.paths import data_root

HERE = Path(__file__).resolve().parent
SHARED = data_root(check=False) / "flickr8k"  # $VLMATCH_DATA/flickr8k: the photos and Karpathy captions
TRAIN_CAPTIONS = 30000

# family -> bundled Flickr8k config (its model options, batch size, lr, margin)
FAMILIES = {"vsepp": "vsepp_f8k", "scan_t2i": "scan_t2i_avg_f8k", "scan_i2t": "scan_i2t_avg_f8k",
            "caan": "caan_f8k", "sman": "sman_f8k", "mtfn": "mtfn_f8k", "mmca": "mmca_f8k"}
TRANSFORMER_ONLY = {"mmca"}  # its text side is a transformer whatever the option says


def _timed(fn, seconds: float) -> float:
    reps, t0 = 0, time.perf_counter()
    while True:
        fn()
        reps += 1
        if time.perf_counter() - t0 >= seconds:
            return (time.perf_counter() - t0) / reps


def peaks(seconds: float) -> dict:
    x, y, out = torch.randn(2048, 1024), torch.randn(1024, 2048), torch.empty(2048, 2048)
    torch.mm(x, y, out=out)
    gemm = 2 * 2048 * 1024 * 2048 / _timed(lambda: torch.mm(x, y, out=out), seconds)
    t = torch.randn(64, 4096)
    o = torch.empty_like(t)
    tanh = t.numel() / _timed(lambda: torch.tanh(t, out=o), seconds)
    sigmoid = t.numel() / _timed(lambda: torch.sigmoid(t, out=o), seconds)
    return {"gemm_flops": gemm, "transcendentals_per_s": max(tanh, sigmoid), "tanh_per_s": tanh, "sigmoid_per_s": sigmoid}


def captions(n: int) -> list[str]:
    data = json.loads((SHARED / "dataset_flickr8k.json").read_text())
    out = [s["raw"] for im in data["images"] if im["split"] == "train" for s in im["sentences"]]
    return out[:n]


def recurrent_transcendentals(model, n_words: int, batch: int) -> int:
    """Sigmoid / tanh evaluations of every GRU / LSTM in the model over ``batch`` sequences of ``n_words``
    steps: per step and direction, gates x hidden (+ hidden for the LSTM's cell tanh)."""
    trans = 0
    for m in model.modules():
        if isinstance(m, (torch.nn.GRU, torch.nn.LSTM)):
            gates = 3 if isinstance(m, torch.nn.GRU) else 4
            dirs = 2 if m.bidirectional else 1
            h = m.hidden_size
            trans += m.num_layers * batch * n_words * dirs * (gates * h + (h if gates == 4 else 0))
    return trans


def measure(family: str, text: str, a, compiled: bool = False) -> dict:
    from torch.utils.flop_counter import FlopCounterMode

    from vlmatch import create_model
    from vlmatch.training.config import load_config
    from vlmatch.training.loop import make_optimizer

    torch.manual_seed(0)
    cfg = load_config(FAMILIES[family])
    tc = cfg["train"]
    opts = {k: v for k, v in cfg["model"].items() if k != "name"}
    opts["img_dim"] = 1280
    if family not in TRANSFORMER_ONLY:
        opts["text_encoder"] = text
    if text == "gru" and family not in TRANSFORMER_ONLY:
        opts["vocab_size"] = a.vocab
    model = create_model(cfg["model"]["name"], **opts)
    b = tc["batch_size"]
    caps = captions(b)
    if model.uses_vocab:  # random word ids with the captions' word counts
        n = [len(c.split()) for c in caps]
        lengths = torch.tensor(n)
        tokens = torch.randint(1, a.vocab, (b, max(n)))
        tokens[torch.arange(max(n))[None, :] >= lengths[:, None]] = 0
    else:
        tokens, lengths = model.tokenize(caps)
        from vlmatch.data.loaders import token_lists

        model.prepare_captions(token_lists(model.tokenize, caps))  # the trainer's prefill: steps read the cache
    feats = torch.randn(b, 49, 1280)
    batch = {"image_index": torch.arange(b)}
    optimizer = make_optimizer([p for p in model.parameters() if p.requires_grad], tc)
    model.train()

    def step():
        scores = model(feats, None, tokens, lengths)
        loss = model.loss(scores, batch, tc, True)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], tc["grad_clip"])
        optimizer.step()

    if compiled:  # what train.compile does: the pair score through torch.compile, shapes dynamic
        from vlmatch.training.loop import compiled_score

        model.score = fn = compiled_score(model)
    t0 = time.perf_counter()
    step()  # warm-up (compiled: the compilation)
    warmup_s = time.perf_counter() - t0
    times = []
    t_end = time.perf_counter() + a.seconds
    while time.perf_counter() < t_end or len(times) < 3:
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    ms = 1e3 * statistics.median(times)
    model.__dict__.pop("score", None)  # count the eager graph's products
    with torch.no_grad(), FlopCounterMode(display=False) as fc:
        model.encode_images(feats, None)
        model.encode_texts(tokens, lengths)
    enc_macs = fc.get_total_flops() // 2
    rnn_trans = recurrent_transcendentals(model, int(lengths.float().mean().round()), b)
    pair = model.batch_score_flops(b, 49, int(lengths.float().mean().round())) or {"macs": 0, "transcendentals": 0}
    macs = enc_macs + pair["macs"]
    trans = rnn_trans + pair["transcendentals"]
    return {"family": family, "text": "minilm" if family in TRANSFORMER_ONLY else text, "model": cfg["model"]["name"],
            "compiled": compiled, "compile_s": warmup_s if compiled else None,
            "compile_failed": bool(compiled and fn.failed),
            "batch": b, "words_mean": float(lengths.float().mean()), "ms_per_step": ms,
            "ms_min": 1e3 * min(times), "ms_max": 1e3 * max(times), "steps_timed": len(times),
            "forward_macs": macs, "encoder_macs": enc_macs, "pair_macs": pair["macs"],
            "transcendentals": trans, "sizes": {k: opts[k] for k in ("embed_dim", "attn_dim") if k in opts}}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    ap.add_argument("--text", nargs="+", default=["gru", "minilm"], choices=["gru", "minilm"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=8.0, help="time each family's steps at least this long")
    ap.add_argument("--vocab", type=int, default=3000, help="word vocabulary of the gru text side")
    ap.add_argument("--compile", action="store_true", help="also time each step with train.compile (torch.compile "
                    "of the model's score; the first step, which compiles, is left out)")
    ap.add_argument("--system-allocator", action="store_true",
                    help="leave glibc's allocator as it is (large blocks mapped and unmapped every step) instead of "
                         "keeping freed memory for the next step as training does (train.reuse_freed_memory)")
    ap.add_argument("--note", default="")
    ap.add_argument("--out", help="results path without suffix (default: benchmarks/results/train_roofline, "
                                  "or train_roofline_system_allocator with --system-allocator)")
    a = ap.parse_args(argv)
    from vlmatch_lab.inputs import need_shared

    need_shared(SHARED)  # the captions of the timed batches
    a.out = a.out or str(HERE / "results" / ("train_roofline_system_allocator" if a.system_allocator
                                             else "train_roofline"))
    torch.set_num_threads(a.threads)
    from vlmatch.training.allocator import keep_freed_memory

    allocator = "system" if a.system_allocator else ("reuse" if keep_freed_memory() else "system (not glibc)")
    os.environ.setdefault("VLMATCH_CACHE", tempfile.mkdtemp(prefix="vlmatch-roofline-"))
    pk = peaks(2.0)
    print(f"GEMM {pk['gemm_flops'] / 1e9:.1f} GFLOP/s, transcendentals {pk['transcendentals_per_s'] / 1e9:.2f} G/s "
          f"({a.threads} threads)", flush=True)
    rows = []
    for fam in a.families:
        for text in a.text:
            if fam in TRANSFORMER_ONLY and text == "gru":
                continue
            for compiled in (False, True) if a.compile else (False,):
                r = measure(fam, text, a, compiled)
                r["bound_ms"] = 1e3 * (3 * 2 * r["forward_macs"] / pk["gemm_flops"]
                                       + r["transcendentals"] / pk["transcendentals_per_s"])
                r["ratio"] = r["ms_per_step"] / r["bound_ms"]
                r["minutes_per_epoch"] = r["ms_per_step"] * -(-TRAIN_CAPTIONS // r["batch"]) / 60000
                rows.append(r)
                print(f"{fam:9s} {r['text']:6s} {'compiled' if compiled else 'eager':8s} B={r['batch']:3d}  "
                      f"{r['ms_per_step']:8.1f} ms/step  bound {r['bound_ms']:7.1f} ({r['ratio']:.1f}x)  "
                      f"{r['minutes_per_epoch']:.2f} min/epoch", flush=True)
    report = {"threads": a.threads, "allocator": allocator, "peaks": pk, "rows": rows, "torch": torch.__version__,
              "cpu": cpu_model(), "cpu_flags": cpu_flags(), "note": a.note,
              "command": "python benchmarks/train_roofline.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    from harness import write_report

    write_report(a.out, report, render)


ALLOCATOR = {"reuse": "Memory as training runs it: freed memory kept for the next step (`train.reuse_freed_memory`).",
             "system": "Memory: glibc's default (large blocks mapped and unmapped every step; `--system-allocator`)."}


def render(r: dict) -> str:
    p = r["peaks"]
    lines = ["# Training roofline: ms per training step against each family's compute bound", "",
             f"{r['threads']} threads, torch {r['torch']}, {r['cpu']} (flags: {' '.join(r['cpu_flags'])}). "
             f"Peaks measured in the same run: float32 GEMM {p['gemm_flops'] / 1e9:.1f} GFLOP/s, transcendentals "
             f"{p['transcendentals_per_s'] / 1e9:.2f} G/s. Bound = 3 x forward MACs x 2 / GEMM peak + forward "
             "transcendentals / their rate (see the script's docstring for what is counted). A step = encode, "
             "score the B x B batch, loss, backward, clipping, optimizer. `minilm` reads its cached token vectors "
             "(the training path); `gru` runs the paper's recurrent encoder.", "",
             ALLOCATOR.get(r.get("allocator", "system"), r.get("allocator", "")), ""]
    if r.get("note"):
        lines += [r["note"], ""]
    lines += ["| family | text | train.compile | batch | ms / step (min-max) | encoder MMACs | pair MMACs | bound ms "
              "| step / bound | min / epoch |", "|---|---|---|---|---|---|---|---|---|---|"]
    for x in r["rows"]:
        how = "no"
        if x.get("compiled"):
            how = "failed: ran eagerly" if x.get("compile_failed") else f"yes ({x['compile_s']:.0f} s to compile)"
        lines.append(f"| {x['family']} (`{x['model']}`) | {x['text']} | {how} | {x['batch']} | {x['ms_per_step']:.1f} "
                     f"({x['ms_min']:.0f}-{x['ms_max']:.0f}) | {x['encoder_macs'] / 1e6:,.0f} | {x['pair_macs'] / 1e6:,.0f} "
                     f"| {x['bound_ms']:.1f} | {x['ratio']:.1f}x | {x['minutes_per_epoch']:.2f} |")
    lines += ["", f"Command: `{r['command']}`", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
