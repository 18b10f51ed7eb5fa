"""The shipped models' card, generated from ``registry.json`` so that it cannot drift from it: the blocks between
the markers of :data:`BLOCKS` in the README and docs (``python release/ship.py --card`` rewrites them; a test checks
them)."""

from __future__ import annotations

from pathlib import Path

from ..errors import DataError
from ..io import write_text
from . import Pretrained, entries

BEGIN = "<!-- pretrained-table:begin -->"
END = "<!-- pretrained-table:end -->"
# the README's shorter block: the table and a link to the full cards (the README is a front page)
SUMMARY_BEGIN = "<!-- pretrained-summary:begin -->"
SUMMARY_END = "<!-- pretrained-summary:end -->"
# the search guide's paragraph on the default model's calibration (docs/search.md): its figures, not a copy
CALIBRATION_BEGIN = "<!-- default-calibration:begin -->"
CALIBRATION_END = "<!-- default-calibration:end -->"
ROLES = {"retriever": "stage 1: one global vector per image and caption",
         "rescorer": "stage 2: re-scores stage 1's candidates pair by pair"}
RECALLS = {"i2t_r1": "image-to-text R@1", "i2t_r5": "R@5", "i2t_r10": "R@10",
           "t2i_r1": "text-to-image R@1", "t2i_r5": "R@5", "t2i_r10": "R@10"}


def _num(v, fmt: str = ".1f") -> str:
    return "-" if v is None else format(v, fmt)


def table(found: list[Pretrained]) -> list[str]:
    rows = ["| name | model | role | MB | val rsum | i2t R@1 | t2i R@1 | ms / query | default |",
            "|---|---|---|---|---|---|---|---|---|"]
    for e in found:
        v = e.val.get(e.storage, {})
        rows.append(f"| `pretrained:{e.name}` | {e.model} | {e.role} | {e.megabytes:.1f} | {e.val_rsum:.1f} "
                    f"| {_num(v.get('i2t_r1'))} | {_num(v.get('t2i_r1'))} | {_num(e.ms_per_query)} "
                    f"| {'yes' if e.default else ''} |")
    return rows


def _search_lines(e: Pretrained) -> list[str]:
    s = e.search
    if not s:
        return []
    out = []
    if "build_images_per_s" in s:
        spread = s.get("build_images_per_s_range")
        runs = (f" (the median of {s.get('build_runs', 'several')} runs, {spread[0]:.1f}-{spread[1]:.1f})"
                if spread and spread[0] != spread[1] else "")
        out.append(f"- Index build: {s['build_images_per_s']:.1f} images/s{runs} from JPEG folders "
                   f"({s.get('build_note', 'feature extraction included')}).")
    if "query_p50_ms" in s:
        where = "in the default search " if e.default else ""
        out.append(f"- Text query {where}at {s.get('n_images', 0):,} images: p50 {s['query_p50_ms']:.1f} ms, "
                   f"p99 {s['query_p99_ms']:.1f} ms ({s.get('latency_note', 'text encoding included')}).")
    if "two_stage_r10" in s:
        out.append(f"- Two-stage text-to-image R@10 on Flickr8k val at K = 100, the concept columns included: "
                   f"{s['two_stage_r10']:.1f} (the ranker's own exhaustive ranking: {s['exhaustive_r10']:.1f}).")
    if "host" in s:
        out.append(f"- Measured on {s['host']}.")
    return out


def _open_vocab_lines(e: Pretrained) -> list[str]:
    """The search this model runs when it builds an index: the fusion with the concept scorer, and the relevance."""
    ov = e.open_vocab
    if not ov:
        return []
    c = ov.get("concepts", {})
    form = (f"its {c.get('top_k', '?')} most likely "
            + ("WordNet nodes, each class's probability also given to its hypernyms" if c.get("tree", True)
               else "ImageNet classes")
            + (f", weighted by specificity to the power {c['ic_power']:g}" if "ic_power" in c else ""))
    space = "the ranker's own text space" if ov.get("text") == "ranker" else "MiniLM's sentence space"
    cols = f" projected on {ov['dims']} columns" if ov.get("dims") else ""
    out = [f"- Search with this model (`index build`): each photo also carries what the backbone's ImageNet head sees "
           f"in it ({form}) in {space}{cols}; a query scores the ranker's score plus (w0 {ov['w0']:g} + "
           f"{ov['slope']:g} x the share of its words unseen in training) x {ov['ratio']:g} times that concept score "
           "(`docs/open-vocabulary.md`; the choice in `experiments/results/open_vocab.md`)."]
    rel = ov.get("relevance") or {}
    if rel:
        out.append(f"- Relevance (the probability that a person calls the photo a match for the query): fitted to "
                   f"val pairs each judged by two readers, independent sessions of a vision-capable AI model rather "
                   f"than people (`experiments/judgments/`, `experiments/results/open_vocab/relevance.json`); "
                   f"\"no photo matches this well\" when the best photo's relevance is under {rel['threshold']:g}.")
    return out


def _pair_lines(e: Pretrained, found: list[Pretrained]) -> list[str]:
    """The pair this re-scorer was measured in: the default search pair, or the command that builds that pair."""
    p = e.val.get("pair")
    if not p:
        return []
    rec = ", ".join(f"{name} {p[k]:.1f}" for k, name in RECALLS.items() if k in p)
    retriever = next((x for x in found if x.name == p["retriever"]), None)
    if e.default and retriever is not None and retriever.default:
        lead = f"In the default search pair, stage 2 ranks by the mean of this model's score and " \
               f"`pretrained:{p['retriever']}`'s (`index build --score {p['score']}`)"
    else:
        lead = f"Paired with `pretrained:{p['retriever']}` as its stage 1 (not the default search: `index build --model " \
               f"pretrained:{e.name} --retriever pretrained:{p['retriever']} --score {p['score']}`), stage 2 ranks by the " \
               f"mean of the two models' scores"
    return [f"- {lead}: val rsum {p['rsum']:.1f}; {rec}."]


def _calibration_lines(e: Pretrained, above: str = "The val figures above are") -> list[str]:
    c = e.calibration
    if not c:
        return []
    banks = " and ".join(f"{b.get('source') or str(b.get('rows')) + ' ' + side + 's'}" for side, b in c["banks"].items())
    u = c["uncalibrated"]
    h = c.get("held_out")
    if not h:
        return [f"- Scores calibrated against a query bank (`calibration.safetensors`; {c['method']}, beta {c['beta']:g}): "
                f"{banks}. {above} calibrated; without it rsum {u['rsum']:.1f}, image-to-text R@1 "
                f"{u['i2t_r1']:.1f}, text-to-image R@1 {u['t2i_r1']:.1f} (`experiments/results/calibration.md`"
                + (f"; made by `{c['command']}`)." if c.get("command") else ").")]
    hu, bk = h["uncalibrated"], h["banks"]
    gain = (h["B"]["rsum"] - hu["B"] + h["A"]["rsum"] - hu["A"]) / 2
    names = {"text": "the text bank alone", "both": "both banks"}
    return [f"- Scores calibrated against a query bank (`calibration.safetensors`; {c['method']}, beta {c['beta']:g} "
            f"picked on half A of val): {banks}. Held out (each half of val: 500 photos, 2,500 captions): half B at "
            f"that beta reads rsum {h['B']['rsum']:.1f} against {hu['B']:.1f} uncalibrated, and half A at the beta "
            f"picked on B ({h['beta_B']:g}) {h['A']['rsum']:.1f} against {hu['A']:.1f}: a gain of {gain:+.1f}. The "
            f"banks shipped were chosen looking at all of val; cross-fitted, {names[bk['chosen_on_A']]} (chosen on A) "
            f"reads {bk['B']:.1f} on B and {names[bk['chosen_on_B']]} (chosen on B) {bk['A']:.1f} on A. {above} "
            f"all of val at the shipped beta, half A included (not held out); without the "
            f"calibration rsum {u['rsum']:.1f}, image-to-text R@1 {u['i2t_r1']:.1f}, text-to-image R@1 "
            f"{u['t2i_r1']:.1f} (`experiments/results/calibration.md`; `{h['command']}`)."]


def _explainer_lines(e: Pretrained) -> list[str]:
    x = e.explainer
    if not x or x.get("pointing") is None:
        return []
    mirror = ", each the mean of the photo's and its mirror image's, `--mirror`" if x.get("mirror") else ""
    default = "; the default explainer of `vlmatch explain`." if x.get("default") else "."
    return [f"- Heat maps (`--method {x['method']}`{mirror}): point inside the named thing's box for "
            f"{x['pointing']:.1f} % of the {x['phrases']:,} Flickr30k Entities phrases of Flickr8k val (the photo's "
            f"centre: {x['centre']:.1f} %; `experiments/results/grounding.md`){default}"
            + (f" {x['selection']}" if x.get("selection") else "")]


def _choice(c: dict) -> str:
    among = c["among"]
    n = among if isinstance(among, int) else len(among)
    names = "" if isinstance(among, int) else ": " + ", ".join(f"`{r}`" for r in among)
    return f"{c['what']} (best of {n} by {c['by']}{names})"


def _selected_lines(e: Pretrained) -> list[str]:
    """What was chosen on the same val data as the figures, among how many; cross-fitted choices apart."""
    if not e.selected:
        return []
    same = [_choice(c) for c in e.selected if not c.get("cross_fitted")]
    crossed = [_choice(c) for c in e.selected if c.get("cross_fitted")]
    parts = []
    if same:
        parts.append("Chosen on the same Flickr8k val as the figures above (so they overstate what new data would "
                     "give): " + "; ".join(same) + ".")
    if crossed:
        parts.append("Chosen on one half of val and reported on the other (cross-fitted): " + "; ".join(crossed) + ".")
    return ["- " + " ".join(parts)]


def card(e: Pretrained, found: list[Pretrained] | None = None) -> list[str]:
    """``e``'s section; ``found`` (default: the registry) holds the retriever a re-scorer's pair names."""
    v = e.val.get(e.storage, {})
    rec = ", ".join(f"{name} {v[k]:.1f}" for k, name in RECALLS.items() if k in v)
    f = e.features
    lines = [f"### `pretrained:{e.name}`", "",
             f"- Model: `{e.model}`, {e.role} ({ROLES.get(e.role, e.role)}); weights stored in {e.storage}, "
             f"{e.megabytes:.1f} MB, SHA-256 `{e.sha256[:16]}...`.",
             f"- Image features: {f.get('name', '?')} at {f.get('input_size', '?')} px, a "
             f"{f.get('grid', '?')} x {f.get('grid', '?')} grid of {f.get('dim', '?')}-d cells. Text: {e.text_encoder}.",
             f"- Trained on: {e.data}.",
             f"- Terms: {e.licence}.",
             f"- Val (Flickr8k Karpathy val, 1,000 images x 5,000 captions): rsum {e.val_rsum:.1f}; {rec}"
             + (f"; {e.val['epochs_trained']} epochs trained, best after epoch {e.val['best_epoch'] + 1}."
                if "epochs_trained" in e.val and e.val.get("best_epoch") is not None else "."),
             *_selected_lines(e),
             *_pair_lines(e, entries() if found is None else found),
             *_calibration_lines(e),
             *_explainer_lines(e),
             *_open_vocab_lines(e),
             *_search_lines(e),
             f"- Expected to be weak: {e.notes}" if e.notes else "",
             f"- Reproduce (from a checkout of the repository, with Flickr8k beside it): "
             f"`python experiments/run.py experiments/recipes/pretrained/{e.name}.yaml`, then "
             f"`python release/ship.py --recipe experiments/recipes/pretrained/{e.name}.yaml` (first recorded as "
             f"`{e.command}`)", ""]
    return [ln for ln in lines if ln != "" or ln is lines[-1]]


def render(found: list[Pretrained] | None = None) -> str:
    """The model card block (without the markers)."""
    found = entries() if found is None else found
    if not found:
        return "No trained models ship with this installation.\n"
    out = table(found) + [""]
    for e in found:
        out += card(e, found)
    out += ["To train one on your own data, see the training guide: a config with `text_encoder: minilm`, your "
            "images as precomputed features (`vlmatch features extract`), then `vlmatch train`; any run's `best` "
            "folder works wherever `pretrained:NAME` does."]
    return "\n".join(out) + "\n"


def summary(found: list[Pretrained] | None = None) -> str:
    """The README's block: the table, and where each model's full card is."""
    found = entries() if found is None else found
    if not found:
        return "No trained models ship with this installation.\n"
    return "\n".join(table(found) + ["", "Each model's card (features, data and terms, heat maps, the command that "
                                         "trained it): [Shipped models](docs/pretrained.md)."]) + "\n"


def default_calibration(found: list[Pretrained] | None = None) -> str:
    """The search guide's paragraph on the shipped default's calibration: its card's calibration line as prose."""
    from . import default_pair

    found = entries() if found is None else found
    name = default_pair()[0]
    default = next((e for e in found if e.name == name and e.calibration), None)
    if default is None:
        return "The shipped default model has no calibration.\n"
    line = _calibration_lines(default, "Its card's val figures ([Shipped models](pretrained.md)) are")[0][2:]
    return f"For the shipped default, `pretrained:{default.name}`: {line}\n"


# the generated blocks: markers -> what fills them
BLOCKS = {"card": (BEGIN, END, render), "summary": (SUMMARY_BEGIN, SUMMARY_END, summary),
          "calibration": (CALIBRATION_BEGIN, CALIBRATION_END, default_calibration)}


def update(path: Path, block: str | None = None, summary_block: bool = False, kind: str | None = None) -> bool:
    """Rewrite ``path``'s block (the card's, the summary's, or ``kind``'s of :data:`BLOCKS`); True when it changed."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    begin, end, fill = BLOCKS[kind or ("summary" if summary_block else "card")]
    a, b = text.find(begin), text.find(end)
    if a < 0 or b < a:
        raise DataError(path, f"holds no {begin} ... {end} block ({kind or 'card'})")
    new = text[:a + len(begin)] + "\n" + (fill() if block is None else block) + text[b:]
    if new == text:
        return False
    write_text(path, new)
    return True
