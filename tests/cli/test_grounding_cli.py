"""``vlmatch grounding`` (precomp folder and photo folder) and ``vlmatch explain --method`` end to end."""

import json

import numpy as np
import pytest

from tests.encoders.tiny_bert import tiny_bert_folder
from vlmatch.cli import main
from vlmatch.models.registry import create_model

from ..evaluation.gridworld import make_gridworld
from ..search.photo_index import draw_photos


@pytest.fixture(scope="module")
def grid_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("grid")
    feats, names, _ = make_gridworld(root / "entities", n_images=6)
    data = root / "precomp"
    data.mkdir()
    np.save(data / "dev_ims.npy", feats)
    caps = []
    for n in names:
        lines = (root / "entities" / "Sentences" / f"{n.split('_')[0]}.txt").read_text().splitlines()
        caps += [_plain(ln) for ln in lines]
    (data / "dev_caps.txt").write_text("\n".join(caps) + "\n")
    (data / "dev_ids.txt").write_text("\n".join(names) + "\n")
    bert = tiny_bert_folder(root / "bert", hidden=16, layers=1, heads=2, words=("a", "and", "dog", "car", "cat", "kite"))
    model = create_model("scan_t2i_avg", img_dim=8, embed_dim=8, text_encoder=str(bert), text_cache=False)
    ck = root / "ck"
    model.save(ck)
    return data, root / "entities", ck


def _plain(line):
    from vlmatch.data.entities import parse_sentence

    return parse_sentence(line).text


@pytest.mark.parametrize("method", ["attention", "contribution", "occlusion"])
def test_grounding_on_a_precomp_folder_prints_the_table_and_writes_json(grid_data, tmp_path, capsys, method):
    data, ents, ck = grid_data
    out = tmp_path / "g.json"
    assert main(["grounding", "--model", str(ck), "--data", str(data), "--split", "val", "--entities", str(ents),
                 "--method", method, "--json", str(out), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "pointing" in printed.splitlines()[0]
    res = json.loads(out.read_text())
    assert res["method"] == method and res["phrases"] == 18 and res["ceiling"] == 100.0
    for key in ("pointing", "centre", "caption_mean", "by_type"):
        assert key in res
    assert json.loads(printed.strip().splitlines()[-1]) == {k: v for k, v in res.items() if k != "per_image"}
    assert sum(res["per_image"]["phrases"]) == res["phrases"] and len(res["per_image"]["names"]) == res["images"]


def test_grounding_errors_are_one_line(grid_data, tmp_path, capsys):
    data, ents, ck = grid_data
    assert main(["grounding", "--model", str(ck), "--data", str(data), "--split", "dev",
                 "--entities", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no Annotations/ folder" in err


def _photo_world(tmp_path):
    photos = draw_photos(tmp_path / "photos" / "images", 3)
    names = sorted(p.name for p in photos.iterdir())
    meta = {"images": [{"filename": n, "split": "val", "sentences": []} for n in names]}
    (tmp_path / "photos" / "dataset.json").write_text(json.dumps(meta))
    ents = tmp_path / "ents"
    (ents / "Sentences").mkdir(parents=True)
    (ents / "Annotations").mkdir()
    (ents / "Sentences" / "photo.txt").write_text("[/EN#1/scene the whole scene] .\n")
    (ents / "Annotations" / "photo.xml").write_text(
        "<annotation><size><width>320</width><height>240</height></size><object><name>1</name><bndbox>"
        "<xmin>1</xmin><ymin>1</ymin><xmax>320</xmax><ymax>240</ymax></bndbox></object></annotation>")
    return tmp_path / "photos", ents


@pytest.mark.slow  # the shipped default explainer
def test_grounding_without_model_uses_the_shipped_default_explainer(tmp_path, capsys):
    from vlmatch import pretrained

    name, method = pretrained.default_explainer()
    photos, ents = _photo_world(tmp_path)
    assert main(["grounding", "--data", str(photos), "--split", "val", "--entities", str(ents), "--no-progress"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert name in res["model"] and res["method"] == method and res["phrases"] == 3
    assert res["grid"] == pretrained.get(name).features["grid"]
    assert res["mirror"] is bool(pretrained.get(name).explainer.get("mirror"))  # as its record says (the default: on)


def test_grounding_on_a_photo_folder_with_a_karpathy_json(tmp_path, capsys):
    photos, ents = _photo_world(tmp_path)
    # photo_000 .. photo_002 share the id "photo": one annotation for all three
    assert main(["grounding", "--model", "pretrained:vsepp-minilm-f8k", "--data", str(photos),
                 "--split", "val", "--entities", str(ents), "--method", "contribution", "--no-progress"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["phrases"] == 3 and res["pointing"] == 100.0 and res["centre"] == 100.0


@pytest.mark.parametrize("method", ["contribution", "occlusion"])
def test_explain_method_and_phrase_on_the_cli(tmp_path, capsys, method):
    photo = sorted(draw_photos(tmp_path / "p", 1).iterdir())[0]
    out = tmp_path / "m.json"
    assert main(["explain", "--model", "pretrained:vsepp-minilm-f8k", "--image", str(photo), "--text",
                 "a red ball on the grass", "--method", method, "--phrase", "a red ball", "--out",
                 str(tmp_path / "m.png"), "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["method"] == method and res["words"][-1] == "a red ball"
    w = np.array(res["weights"])
    assert w.shape[0] == 49 and w.shape[1] == len(res["words"])
    if method == "contribution":  # token columns sum to the score; the phrase column is a sum of some of them
        assert w[:, :-1].sum() == pytest.approx(res["score"], rel=1e-4)
    assert (tmp_path / "m.png").stat().st_size > 0


def test_grounding_mirror_on_a_photo_folder_and_its_one_line_errors(grid_data, tmp_path, capsys):
    photos, ents = _photo_world(tmp_path)
    assert main(["grounding", "--model", "pretrained:vsepp-minilm-f8k", "--data", str(photos), "--split", "val",
                 "--entities", str(ents), "--method", "contribution", "--mirror", "--no-progress"]) == 0
    out = capsys.readouterr().out
    res = json.loads(out.strip().splitlines()[-1])
    assert res["mirror"] is True and res["phrases"] == 3 and res["pointing"] == 100.0
    data, ents, ck = grid_data  # features with no photo folder behind them: --mirror cannot see the photos
    assert main(["grounding", "--model", str(ck), "--data", str(data), "--split", "val", "--entities", str(ents),
                 "--mirror", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--mirror needs the photos" in err and "features.json" in err


@pytest.mark.slow  # seconds
def test_explain_mirror_on_the_cli(tmp_path, capsys):
    photo = sorted(draw_photos(tmp_path / "p", 1).iterdir())[0]
    args = ["explain", "--model", "pretrained:vsepp-minilm-f8k", "--image", str(photo), "--text",
            "a red ball on the grass", "--method", "contribution", "--out", str(tmp_path / "m.png")]
    assert main([*args, "--json", str(tmp_path / "one.json")]) == 0
    assert main([*args, "--json", str(tmp_path / "two.json"), "--mirror"]) == 0
    assert "mirror image" in capsys.readouterr().out.splitlines()[-1]
    one, two = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("one", "two"))
    assert not one["mirrored"] and two["mirrored"] and two["score"] == pytest.approx(one["score"], rel=1e-5)
    # each view's contributions sum to its score: the mean's, to the mean of the two scores
    assert np.sum(two["weights"]) == pytest.approx((two["score"] + two["mirror_score"]) / 2, rel=1e-4)
    assert not np.allclose(two["weights"], one["weights"])
