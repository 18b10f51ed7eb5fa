"""``vlmatch models``, ``vlmatch configs`` and ``vlmatch pretrained``: what this installation offers."""

from __future__ import annotations


def add_parser(sub):
    p = sub.add_parser("models", help="list registered models")
    p.set_defaults(func=cmd_models)
    c = sub.add_parser("configs", help="list bundled configs")
    c.set_defaults(func=cmd_configs)
    t = sub.add_parser("pretrained", help="list the trained models shipped with vlmatch (--model pretrained:NAME)")
    t.add_argument("--json", action="store_true", help="print the registry entries as a JSON list")
    t.set_defaults(func=cmd_pretrained)
    s = sub.add_parser("seal", help="record the SHA-256 of every file of a checkpoint saved by an older vlmatch "
                                    "(checksums.json), after checking that it loads; a folder saved sealed is "
                                    "never sealed again (restore it whole)")
    s.add_argument("checkpoint", help="a checkpoint folder saved by an older vlmatch (no format in its config.json)")
    s.set_defaults(func=cmd_seal)


def cmd_models(a):
    from ..models.registry import describe_models

    print("\n".join(f"{n:16s} {d}" for n, d in describe_models().items()))


def cmd_pretrained(a):
    import dataclasses
    import json

    from .. import pretrained

    found = pretrained.entries()
    if a.json:
        print(json.dumps([{**dataclasses.asdict(e), "megabytes": round(e.megabytes, 2)} for e in found], indent=1))
        return
    if not found:
        print("no pretrained models are shipped with this installation")
        return
    rows = [("name", "model", "role", "MB", "val rsum", "ms/query", "text encoder", "default")]
    rows += [(e.name, e.model, e.role, f"{e.megabytes:.1f}", f"{e.val_rsum:.1f}",
              "-" if e.ms_per_query is None else f"{e.ms_per_query:.1f}", e.text_encoder, "yes" if e.default else "")
             for e in found]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    print("\nuse one with --model pretrained:NAME, or in Python vlmatch.load_model('pretrained:NAME')")


def cmd_configs(a):
    from ..training.config import describe_configs

    configs = describe_configs()
    width = max(map(len, configs), default=0)
    print("\n".join(f"{name:{width}s}  {desc}" for name, desc in configs.items()))


def cmd_seal(a):
    from pathlib import Path

    from ..checkpoints.read import read_config_json
    from ..checkpoints.seal import CHECKSUMS, seal_checkpoint, unsealed_problem, verify_checkpoint
    from ..errors import DataError
    from ..models.registry import load_model

    d = Path(a.checkpoint)
    if not d.is_dir():
        raise DataError(d, "not a checkpoint folder")
    if verify_checkpoint(d) is not None:  # a file that differs from its record is refused there, never sealed over
        print(f"{d} is sealed already: every file matches its {CHECKSUMS}")
        return
    # only a folder saved by an older vlmatch (no format, nothing a sealed save writes): one saved sealed that lost
    # its seal, or whose format was removed, may hold a part changed since, which a new seal would bless
    problem = unsealed_problem(d, read_config_json(d / "config.json"))
    if problem is not None:
        raise DataError(problem.path, f"{problem.problem} (`vlmatch seal` records only folders saved by an older "
                                      "vlmatch)")
    # its weights match config.json, its parts fit the model, its calibration was fitted for these weights
    load_model(d, note_unsealed=False)
    seal_checkpoint(d)
    print(f"sealed {d}: wrote {d / CHECKSUMS}")
