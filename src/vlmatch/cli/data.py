"""``vlmatch data synth|check`` and ``vlmatch vocab build``."""

from __future__ import annotations

import json

from .common import DATA_HELP, positive_int


def _add_data(sub):
    p = sub.add_parser("data", help="data utilities")
    s = p.add_subparsers(dest="data_cmd", required=True)
    q = s.add_parser("synth", help="write the synthetic toy world in the precomp format")
    q.add_argument("--out", required=True)
    q.add_argument("--seed", type=int, default=0)
    q.add_argument("--train", type=positive_int, default=3000)
    q.add_argument("--dev", type=positive_int, default=1000)
    q.add_argument("--test", type=positive_int, default=1000)
    q.set_defaults(func=cmd_synth)
    c = s.add_parser("check", help="validate a precomp split (shapes, captions, NaN/inf)")
    c.add_argument("--data", required=True, help=DATA_HELP)
    c.add_argument("--split", required=True, help="split name (train, dev, test, ...)")
    c.set_defaults(func=cmd_check)


def cmd_synth(a):
    from ..data.synth import ToyWorld, ToyWorldConfig

    stats = ToyWorld(ToyWorldConfig(seed=a.seed, n_train=a.train, n_dev=a.dev, n_test=a.test)).write(a.out)
    print(json.dumps(stats["splits"], indent=2))


def cmd_check(a):
    from ..data.precomp import PrecompSplit
    from ..data.resolve import resolve_data

    sp = PrecompSplit(resolve_data(a.data), a.split)
    sp.check_all_finite()
    print(json.dumps({"images": sp.n_images, "captions": len(sp.captions), "regions": sp.n_regions,
                      "dim": sp.img_dim, "captions_per_image": sp.per_image}, indent=2))


def _add_vocab(sub):
    p = sub.add_parser("vocab", help="vocabulary utilities")
    s = p.add_subparsers(dest="vocab_cmd", required=True)
    b = s.add_parser("build", help="build a vocabulary (SCAN JSON) from training captions only")
    b.add_argument("--captions", nargs="+", required=True, help="caption files (one caption per line)")
    b.add_argument("--min-count", type=positive_int, default=4)
    b.add_argument("--out", required=True)
    b.set_defaults(func=cmd_vocab)


def cmd_vocab(a):
    from ..data.precomp import read_caption_lines
    from ..data.vocab import Vocab
    from ..io import check_writable

    check_writable(a.out)
    caps = [c for f in a.captions for c in read_caption_lines(f)]
    v = Vocab.build(caps, a.min_count)
    v.save(a.out)
    print(f"{len(v)} words (min count {a.min_count}) from {len(caps)} captions -> {a.out}")


def add_parser(sub):
    _add_data(sub)
    _add_vocab(sub)
