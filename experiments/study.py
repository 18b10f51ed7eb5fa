"""The Flickr8k convergence study (issues 22 and 23) as a queue: the runs still to make, in order.

    python experiments/study.py list          # every planned run, done or not
    python experiments/study.py next          # the command of the first run without a result
    python experiments/study.py run [--max N] # make the missing runs one after another (one training at a time)

A run is done when experiments/results/flickr8k/<name>.json exists (experiments/flickr8k.py writes it when the
run ends). Run folders live under $VLMATCH_CACHE/runs/ and may be gone on another machine; results are in git.
Every run trains at one thread (``--threads`` to change it), so the other core stays free for work beside it; a
run cut off by a stop continues with ``experiments/flickr8k.py ... --resume`` on the same machine (``run`` passes
it when the run folder has a last/ checkpoint), or starts again on another.

The plan is data (``PLAN``): a family's sweep first (2 x 120 steps per learning rate), then its runs to
convergence at the config's learning rate -- set the config to the sweep's winner before they run (``next``
prints the sweep's figures beside the command so the choice is in front of whoever starts it).
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

from vlmatch_lab.caches import runs_dir

HERE = Path(__file__).resolve().parent
RUNS = HERE / "results" / "flickr8k"
CACHE_RUNS = runs_dir()  # the run folders, under the rooms' one cache
SWEEP = ["--set", "train.epochs=2", "--set", "train.max_steps_per_epoch=120", "--set", "train.patience=0",
         "--set", "train.min_epochs=0"]


# the stopping rule: until val rsum has not improved for 3 epochs, at least 10
STOPPING_RULE = ["--set", "train.epochs=30", "--set", "train.patience=3", "--set", "train.min_epochs=10"]
# the shipped VSE++'s schedule: lr 5e-4, a tenth every 2 epochs
VSEPP_SCHEDULE = ["--set", "train.lr=5.0e-4", "--set", "train.lr_update=2"]


def fixed_epochs(n: int) -> list[str]:
    """A fixed budget of ``n`` epochs: no early stop, no minimum."""
    return ["--set", f"train.epochs={n}", "--set", "train.patience=0", "--set", "train.min_epochs=0"]


SMAN_CONSTANT_LR = ["--set", "train.lr_schedule=[[0, 1.0e-3]]"]
RERANK = "flickr8k_rerank.py"  # an entry whose arguments start with it re-ranks trained runs (no training)


def _sweep(config: str, family: str, lrs: list[str], extra: list[str] = ()) -> list[tuple[str, list[str], str]]:
    return [(f"s22_{family}_lr{lr.replace('.0e-', 'e')}",
             ["--config", config, *extra, "--set", "train.lr_schedule=null", "--set", f"train.lr={lr}", *SWEEP],
             f"#22 {family} learning-rate sweep: 2 x 120 steps (warm-up epoch, then hardest negatives)") for lr in lrs]


def _vsepp(name: str, extra: list[str], note: str) -> tuple[str, list[str], str]:
    """The shipped VSE++'s command (vsepp_minilm_f8k at lr 5e-4, / 10 every 2 epochs) with ``extra`` on top."""
    return (name, ["--config", "vsepp_minilm_f8k", *extra, *VSEPP_SCHEDULE],
            note)


# (name, flickr8k.py arguments without --name, note)
PLAN: list[tuple[str, list[str], str]] = [
    ("c22_scan_t2i_rerun", ["--config", "scan_t2i_avg_minilm_f8k"],
     "#25 reproduction: the recorded command of the shipped re-scorer (scan-t2i-minilm-f8k, 281.3) re-run on another host"),
    _vsepp("c22_vsepp_minilm_d512_b64", ["--set", "model.embed_dim=512", "--set", "train.batch_size=64"],
           "#22 evidence: VSE++ at SCAN's budget setting (D 512, batch 64), otherwise the shipped VSE++'s command"),
    *_sweep("caan_minilm_f8k", "caan", ["5.0e-4", "1.0e-3", "2.0e-4"]),
    ("c22_caan", ["--config", "caan_minilm_f8k"], "#22: CAAN (IA + SA) to convergence"),
    ("c22_caan_baseline", ["--config", "caan_minilm_f8k", "--set", "model.name=caan_baseline"],
     "#22: CAAN's baseline (mean pooling) at CAAN's setting: the paper's ablation claim CAAN > baseline"),
    _vsepp("c22_vsepp_minilm_d256_b64", ["--set", "model.embed_dim=256", "--set", "train.batch_size=64"],
           "#22 evidence: VSE++ at CAAN's budget setting (D 256, batch 64), otherwise the shipped VSE++'s command"),
    _vsepp("c22_vsepp_minilm_448", ["--input-size", "448"],
           "#22: the shipped VSE++'s command on Lite0 features of 448 px images (14 x 14 grid, mean-pooled): does the "
           "backbone's view at twice its training resolution help the global model"),
    # VSE++ on the 448 px grid (c22_vsepp_minilm_448: 309.1 against 297.0 at 224 px) with MiniLM fine-tuned: the
    # route to the 330. A frozen sweep point at 448 px first, then the head at that lr and MiniLM at a
    # tenth, a thirtieth and three tenths of it
    ("s22_vsepp448_lr5e4", ["--config", "vsepp_minilm_f8k", "--input-size", "448", "--set", "train.lr_schedule=null",
                            "--set", "train.lr=5.0e-4", *SWEEP],
     "#22 VSE++ sweep on the 448 px grid, frozen MiniLM: 2 x 120 steps at lr 5e-4 (the frozen point of the "
     "fine-tuning sweep)"),
    *[(f"s22_vsepp448_ft_lr5e4_x{x}", ["--config", "vsepp_minilm_f8k", "--input-size", "448", "--set",
                                       "model.finetune=true", "--set", f"train.pretrained_lr_scale={scale}", "--set",
                                       "train.lr_schedule=null", "--set", "train.lr=5.0e-4", *SWEEP],
       f"#22 VSE++ on the 448 px grid with MiniLM fine-tuned at {scale} x the lr: 2 x 120 steps, beside "
       "s22_vsepp448_lr5e4 (frozen)")
      for x, scale in (("10", "0.1"), ("30", "0.0333"), ("3", "0.3"))],
    # (c22_vsepp448_ft, the Lite0 448 px grid with MiniLM fine-tuned to convergence, was planned here and never
    # run: the Lite2 runs below superseded it, with a fixed 6-epoch budget instead of the stopping rule)
    # the image side's capacity: EfficientNet-Lite2 (vlmatch[vision-large]) at 448 px for the shipped VSE++'s command,
    # against c22_vsepp_minilm_448's Lite0 (309.1); the features take ~15 min to extract at two threads
    _vsepp("c22_vsepp_minilm_lite2_448", ["--backbone", "efficientnet-lite2", "--input-size", "448"],
           "#22: the shipped VSE++'s command on EfficientNet-Lite2 features at 448 px (Lite0: c22_vsepp_minilm_448)"),
    # the same with MiniLM fine-tuned at 0.3 x the lr (the 448 px sweep's best scale, s22_vsepp448_ft_*), a fixed
    # budget of 6 epochs (lr 5e-4, / 10 every 2): the frozen runs gain under 0.5 after their sixth epoch, and a
    # fine-tuned epoch costs ~6 min at two threads
    _vsepp("c22_vsepp_lite2_448_ft", ["--backbone", "efficientnet-lite2", "--input-size", "448", "--set",
                                      "model.finetune=true", "--set", "train.pretrained_lr_scale=0.3", *fixed_epochs(6)],
           "#22: c22_vsepp_minilm_lite2_448 with MiniLM fine-tuned at 0.3 x the lr, 6 epochs: the best single model's run"),
    _vsepp("c22_vsepp_minilm_lite2_448_s1", ["--backbone", "efficientnet-lite2", "--input-size", "448", "--set",
                                             "train.seed=1"],
           "#22: c22_vsepp_minilm_lite2_448's command with seed 1: run-to-run noise of the best frozen configuration"),
    # the best single model's second seed (the issue: the best two configurations twice); it replaces the planned
    # c22_vsepp_minilm_448_s1, whose Lite0 448 px configuration the Lite2 runs left behind
    _vsepp("c22_vsepp_lite2_448_ft_s1", ["--backbone", "efficientnet-lite2", "--input-size", "448", "--set",
                                         "model.finetune=true", "--set", "train.pretrained_lr_scale=0.3",
                                         *fixed_epochs(6), "--set", "train.seed=1"],
           "#22: c22_vsepp_lite2_448_ft's command with seed 1: run-to-run noise of the best single configuration"),
    *_sweep("sman_f8k", "sman", ["2.0e-4", "5.0e-4", "1.0e-3"], ["--set", "model.text_encoder=minilm"]),
    *_sweep("mtfn_f8k", "mtfn", ["2.0e-4", "5.0e-4", "1.0e-3"], ["--set", "model.text_encoder=minilm"]),
    # MTFN at convergence (mtfn_minilm_f8k at the sweep's winner, 5e-4), its text-text branch from that
    # run's best (eq. 6-7, S_IT frozen), and MTFN-RR with its own S_TT against MTFN alone
    ("c22_mtfn", ["--config", "mtfn_minilm_f8k"], "#22: MTFN (image-text fusion) to convergence"),
    ("c22_mtfn_tt", ["--config", "mtfn_minilm_f8k", "--set", "train.stage=text_text", "--set",
                     f"train.init_from={CACHE_RUNS / 'c22_mtfn' / 'best'}", "--set", "train.epochs=2", "--set",
                     "train.patience=0", "--set", "train.min_epochs=0"],
     "#22: MTFN's text-text branch, 2 epochs from c22_mtfn's best (S_IT frozen); its val figures are after RR"),
    ("c22_mtfn_rr", [RERANK, "--run", "c22_mtfn", "--text-run", "c22_mtfn_tt"],
     "#22: MTFN-RR with its own S_TT (K = 15, K' = 5) of c22_mtfn's val matrix: the paper's claim MTFN-RR > MTFN"),
    # issue 23's readings 3-5 at a fixed budget of 4 epochs, each against the reference reading's run read at its
    # best within the same 4 epochs (flickr8k.py CLAIMS): the SMAN family's sweep point first, since the runs
    # take its winner
    # the sweep rose to 1e-3: its point beyond (243.5 against 246.9: 1e-3 stays)
    *_sweep("sman_f8k", "sman", ["2.0e-3"], ["--set", "model.text_encoder=minilm"]),
    # items 4 and 5 at a constant lr 1e-3 (sman_minilm_f8k's schedule when they ran, before any drop); the
    # reference, vlmatch's first readings (summed eq. 22, eq. 9 in eq. 5's form), was started as the convergence
    # run and stopped after 5 epochs once per_level had won (its fifth epoch at 1e-4 is not part of the budget)
    ("c23_sman_sum", ["--config", "sman_minilm_f8k", "--set", "model.intra_scale=sum", "--set",
                      "train.lr_schedule=[[0, 1.0e-3], [4, 1.0e-4]]"],
     "#23 items 4 and 5's reference: SMAN with eq. 22 on the summed distance and eq. 9 in eq. 5's form; stopped "
     "after 5 epochs"),
    *[(name, [*args, *SMAN_CONSTANT_LR, *fixed_epochs(4)], note) for name, args, note in (
        ("c23_sman_per_level", ["--config", "sman_minilm_f8k", "--set", "model.intra_scale=per_level"],
         "#23 item 4: SMAN's eq. 22 hinge on the mean per-level distance instead of the summed one, at c22_sman's "
         "setting, 4 epochs"),
        ("c23_sman_eq9", ["--config", "sman_minilm_f8k", "--set", "model.intra_scale=sum", "--set",
                          "model.word_attention=eq9"],
         "#23 item 5: SMAN's word attention as eq. 9 prints it, at c22_sman's setting, 4 epochs"))],
    # SMAN at convergence (sman_minilm_f8k: eq. 22 per level, lr / 10 every 2 epochs) and its ablation below
    ("c22_sman", ["--config", "sman_minilm_f8k"], "#22: SMAN (full) to convergence"),
    ("c23_caan_inner", ["--config", "caan_minilm_f8k", "--set", "model.norm_output=false", *fixed_epochs(4)],
     "#23 item 3: CAAN with the paper's inner product S = <v, u> instead of the cosine, at c22_caan's setting, "
     "4 epochs"),
    # issue 23 item 6, the grid: EfficientNet-Lite0 at the paper's 448 px (14 x 14 = 196 cells), as is and
    # pooled 2 x 2 to the paper's stated 7 x 7; a fixed budget of 3 epochs each at a constant lr 1e-3, as items 4
    # and 5 (where SMAN peaked after its second epoch); 196 cells cost ~4x per pair (~11 min per epoch at two
    # threads)
    *[(f"c23_sman_448_{tag}", ["--config", "sman_minilm_f8k", "--input-size", "448", "--set", f"model.grid_pool={p}",
                               *SMAN_CONSTANT_LR, *fixed_epochs(3)],
       f"#23 item 6: SMAN on Lite0 features at 448 px, {what}; 3 epochs at lr 1e-3, the same for both")
      for tag, p, what in (("grid7", 2, "each 2 x 2 block averaged: the paper's stated 7 x 7 grid (M = 49)"),
                           ("grid14", 1, "the whole 14 x 14 grid (M = 196), what a 448 px res5c gives"))],
    # SMAN-IM for the first 6 epochs of c22_sman's schedule (lr 1e-3, / 10 every 2 epochs: 1e-6 from the seventh
    # on, after which c22_sman moved by at most 0.5), read against c22_sman's best within the same 6 epochs
    ("c22_sman_im", ["--config", "sman_minilm_f8k", "--set", "model.name=sman_im", *fixed_epochs(6)],
     "#22: SMAN-IM (intra-modal attention only) at c22_sman's setting, its first 6 epochs: the paper's claim "
     "SMAN > SMAN-IM"),
    # c22_caan and its baseline peaked after epoch 3 at lr 1e-3 and declined after; VSE++'s schedule (5e-4, / 10
    # every 2 epochs) held its peak: the baseline with it first (cheap), then CAAN if it gains
    ("c22_caan_baseline_decay", ["--config", "caan_minilm_f8k", "--set", "model.name=caan_baseline", "--set",
                                 "train.lr_schedule=null", *VSEPP_SCHEDULE],
     "#22: CAAN's baseline with the shipped VSE++'s schedule (lr 5e-4, / 10 every 2 epochs) instead of 1e-3 / 1e-4"),
    # it gained (276.4 against 265.6): CAAN in full with the same schedule, so the claim CAAN > baseline is also read
    # at the schedule that suits both
    ("c22_caan_decay", ["--config", "caan_minilm_f8k", "--set", "train.lr_schedule=null", *VSEPP_SCHEDULE],
     "#22: CAAN (IA + SA) with the shipped VSE++'s schedule (lr 5e-4, / 10 every 2 epochs), beside "
     "c22_caan_baseline_decay"),
    *_sweep("mmca_f8k", "mmca", ["2.0e-4", "5.0e-4"]),  # validated two-stage (the config's val_top_k)
    # the sweep rose to 5e-4 (177.0 against 166.2): its point beyond (172.3: 5e-4 stays, mmca_f8k's lr)
    *_sweep("mmca_f8k", "mmca", ["1.0e-3"]),
    # MMCA's ablation at the stopping rule (alpha = 0: the cross unit skipped, under a minute per epoch), at the
    # sweep's winner and the config's constant lr of that time (lr_update 10): best after 3 of 10 epochs, then
    # declining (262.3, 35 below VSE++ on the same features)
    ("c22_mmca_a0", ["--config", "mmca_f8k", "--set", "model.alpha=0", "--set", "train.lr_update=10", *STOPPING_RULE],
     "#22: MMCA with alpha = 0 (self-attention only) at c22_mmca's setting: the paper's claim alpha 0.2 > 0"),
    # evidence for that distance: the shipped VSE++'s command at MMCA's budget setting (d 128, batch 32), and MMCA
    # alpha = 0 with that command's schedule (lr 5e-4, / 10 every 2 epochs)
    _vsepp("c22_vsepp_minilm_d128_b32", ["--set", "model.embed_dim=128", "--set", "train.batch_size=32"],
           "#22 evidence: VSE++ at MMCA's budget setting (d 128, batch 32), otherwise the shipped VSE++'s command"),
    ("c22_mmca_a0_decay", ["--config", "mmca_f8k", "--set", "model.alpha=0", "--set", "train.lr_update=2",
                           *STOPPING_RULE],
     "#22 evidence: c22_mmca_a0 with the shipped VSE++'s schedule (lr 5e-4, / 10 every 2 epochs)"),
    # that schedule lifted alpha = 0 from 262.3 to 284.0 (level with VSE++ at d 128 / batch 32, 281.3), and
    # mmca_f8k now decays every 2 epochs. MMCA in full (~11 min per epoch at two threads) with it, a fixed budget of
    # 6 epochs: by then the lr is 5e-7, and c22_mmca_a0_decay moved by under 1 after its sixth epoch. The claim
    # reads both at their best within those 6 epochs (flickr8k.py CLAIMS)
    ("c22_mmca_decay", ["--config", "mmca_f8k", "--set", "train.lr_update=2", *fixed_epochs(6)],
     "#22: MMCA (alpha = 0.2) with lr 5e-4, / 10 every 2 epochs, 6 epochs: the paper's claim alpha 0.2 > 0 against "
     "c22_mmca_a0_decay"),
    # evidence for MTFN's distance to VSE++ (208.5 against 297.0): MTFN sums the hinge over all negatives throughout
    # (hardest negatives collapsed its sigmoid scores); the shipped VSE++'s command with that loss at MTFN's D 512
    _vsepp("c22_vsepp_minilm_sum_d512", ["--set", "model.embed_dim=512", "--set", "train.max_violation=false"],
           "#22 evidence: VSE++ with MTFN's loss (the hinge summed over all negatives, every epoch) at its D 512, "
           "otherwise the shipped VSE++'s command"),
    # that loss costs VSE++ 18 (279.0): the other 70 are MTFN's score form or its budget sizes. MTFN at the paper's
    # sizes (D = d_f = 1024; the config: 512), otherwise c22_mtfn's command
    ("c22_mtfn_d1024", ["--config", "mtfn_minilm_f8k", "--set", "model.embed_dim=1024", "--set", "model.fusion_dim=1024"],
     "#22 evidence: MTFN at the paper's sizes (D = d_f = 1024), otherwise c22_mtfn's command"),
    # two sweeps that rose to their largest point, 1e-3 (CAAN 239.4 against 227.8 at 5e-4; SCAN t-i 241.3 against
    # 233.7), each with its point beyond, as SMAN's and MMCA's have: does the peak lie past the rate they trained at
    *_sweep("caan_minilm_f8k", "caan", ["2.0e-3"]),
    *_sweep("scan_t2i_avg_minilm_f8k", "scan_t2i", ["2.0e-3"]),
    # c22_scan_i2t was stopped by hand after 15 epochs, still creeping up, and its run folder is gone with its
    # machine: its command again, to the stopping rule
    ("c22_scan_i2t_rerun", ["--config", "scan_i2t_avg_minilm_f8k"],
     "#22: c22_scan_i2t's command again, to the stopping rule (the first run was stopped by hand after 15 epochs)"),
]


def done(name: str) -> bool:
    return (RUNS / f"{name}.json").is_file()


def command(name: str, args: list[str], note: str, resume: bool = False, threads: int = 1) -> list[str]:
    if args and args[0] == RERANK:  # its row records its own note (what was re-ranked with what)
        return [sys.executable, str(HERE / RERANK), *args[1:], "--name", name, "--threads", str(threads)]
    return [sys.executable, str(HERE / "flickr8k.py"), *args, "--name", name, "--set", f"train.threads={threads}",
            "--note", note, *(["--resume"] if resume else [])]


def sweep_figures(name: str) -> str:
    """The best val rsum of every finished run of the same sweep (s22_<family>_lr*), for choosing the lr."""
    family = name.split("_lr")[0]
    rows = []
    for f in sorted(RUNS.glob(f"{family}_lr*.json")):
        rows.append(f"{f.stem}: {json.loads(f.read_text())['metrics']['rsum']:.1f}")
    return ", ".join(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["list", "next", "run"])
    ap.add_argument("--max", type=int, default=0, help="run: stop after this many runs (0: all missing)")
    ap.add_argument("--only", nargs="+", metavar="NAME", help="run: only these planned runs (in the plan's order)")
    ap.add_argument("--start-before", metavar="HH:MM",
                    help="run: start no run at or after this local time (a stop's end: a run cut off by it may have "
                         "to start again on another machine)")
    ap.add_argument("--threads", type=int, default=1,
                    help="run: torch threads per training (default 1; 2 only while nothing else runs, pausing the "
                         "training with SIGSTOP / SIGCONT for tests or timings)")
    a = ap.parse_args(argv)
    missing = [(n, args, note) for n, args, note in PLAN if not done(n) and (not a.only or n in a.only)]
    if a.what == "list":
        for n, args, _ in PLAN:
            print(f"{'done ' if done(n) else 'to do'}  {n:28s} {' '.join(args)}")
        return 0
    if a.what == "next":
        if not missing:
            print("every planned run has a result")
            return 0
        n, args, note = missing[0]
        sweeps = {m.split("_lr")[0] for m, _, _ in PLAN if m.startswith("s22_")}
        print(shlex.join(command(n, args, note, threads=a.threads)))
        for figures in filter(None, map(sweep_figures, sorted(sweeps))):
            print(f"  sweep so far: {figures}")
        return 0
    for i, (n, args, note) in enumerate(missing):
        if a.max and i >= a.max:
            break
        if a.start_before and time.strftime("%H:%M") >= a.start_before:
            print(f"study: it is past {a.start_before}: {n} and the runs after it are left for later", flush=True)
            break
        resume = (CACHE_RUNS / n / "last").is_dir()
        cmd = command(n, args, note, resume, a.threads)
        print(f"study: {'resuming' if resume else 'starting'} {n}: {shlex.join(cmd)}", flush=True)
        if subprocess.run(cmd).returncode != 0:
            print(f"study: {n} failed; stopping", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
