"""The grounding objective (``train.grounding_loss``): its targets from Entities files, its config check, and a
learning test on a grid world whose objects' cells are known (a wide margin: any host)."""

import json

import numpy as np
import pytest
import torch

from vlmatch.data.entities import parse_sentence
from vlmatch.errors import ConfigError
from vlmatch.evaluation.grounding import pointing_game
from vlmatch.models.losses import pointing_loss
from vlmatch.models.registry import load_model
from vlmatch.training.config import load_config
from vlmatch.training.grounding import target_cells
from vlmatch.training.loop import train

from ..evaluation.gridworld import make_gridworld


def _precomp(root, split, feats, names, entities):
    np.save(root / f"{split}_ims.npy", feats)
    caps = []
    for n in names:
        lines = (entities / "Sentences" / f"{n.split('_')[0]}.txt").read_text().splitlines()
        caps += [parse_sentence(ln).text for ln in lines]
    (root / f"{split}_caps.txt").write_text("\n".join(caps) + "\n")
    (root / f"{split}_ids.txt").write_text("\n".join(names) + "\n")


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    root = tmp_path_factory.mktemp("gridtrain")
    ents = root / "entities"
    feats, names, _ = make_gridworld(ents, n_images=400, seed=1)
    data = root / "data"
    data.mkdir()
    _precomp(data, "train", feats[:320], names[:320], ents)
    _precomp(data, "dev", feats[320:], names[320:], ents)
    return data, ents, feats[320:], names[320:]


def _cfg(data, ents, weight):
    return load_config(None, extra={
        "model": {"name": "vsepp", "embed_dim": 16, "word_dim": 8, "text_pool": "mean"},
        "data": {"path": str(data), "min_word_count": 1, "entities": str(ents)},
        "train": {"epochs": 6, "batch_size": 32, "lr": 5e-3, "lr_update": 10, "log_every": 1, "threads": 1,
                  "grounding_loss": weight, "seed": 0}})


@pytest.mark.slow  # a training
def test_grounding_loss_makes_the_maps_point_at_the_named_object(grid, tmp_path):
    data, ents, dev_feats, dev_names = grid
    run = tmp_path / "g"
    train(_cfg(data, ents, 5.0), run, progress=False)
    rows = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    ground = [r["grounding"] for r in rows if r["type"] == "train"]
    assert np.mean(ground[-5:]) < 0.1 * np.mean(ground[:5])  # the term is learned (12 -> 0.001 here)
    model = load_model(run / "best")
    res = pointing_game(model, dev_feats, dev_names, ents, "contribution")
    assert res["pointing"] >= 97.0  # held-out images (100 here; without the term 92.5); the centre scores ~13
    assert res["centre"] < 30.0


@pytest.mark.slow  # a training
def test_training_on_mirror_views_pulls_them_into_mirrored_boxes(grid, tmp_path):
    """data.mirror 0.5: half the pairs show the mirror file's features, here each image's cells mirrored (what a
    per-cell model sees in a mirror image); their targets mirrored with them, the maps still learn to point on
    held-out photos. A file whose cells are also turned upside down (a 180-degree turn: its boxes, mirrored left to
    right only, then disagree with it) points far worse: the targets follow the mirror's geometry."""
    from vlmatch.data.mirror import mirror_grid

    data, ents, dev_feats, dev_names = grid
    train_feats = np.load(data / "train_ims.npy")
    results = {}
    for name, view in (("mirrored", lambda f: mirror_grid(f, 3)), ("turned", lambda f: f[::-1].copy())):
        root = tmp_path / name
        root.mkdir()
        for f in ("train_ims.npy", "train_caps.txt", "train_ids.txt", "dev_ims.npy", "dev_caps.txt", "dev_ids.txt"):
            (root / f).write_bytes((data / f).read_bytes())
        np.save(root / "train_mirror_ims.npy", np.stack([view(f) for f in train_feats]))
        cfg = _cfg(root, ents, 5.0)
        cfg["data"]["mirror"] = 0.5
        train(cfg, root / "run", progress=False)
        results[name] = pointing_game(load_model(root / "run" / "best"), dev_feats, dev_names, ents,
                                      "contribution")["pointing"]
    assert results["mirrored"] >= 97.0
    assert results["turned"] < results["mirrored"] - 10


def test_grounding_loss_needs_entities_and_a_decomposing_model(grid, tmp_path):
    data, ents, _, _ = grid
    with pytest.raises(ConfigError, match="needs data.entities"):
        load_config(None, extra={"data": {"path": str(data)}, "train": {"grounding_loss": 1.0}})
    cfg = _cfg(data, ents, 1.0)
    cfg["model"]["text_pool"] = "last"  # a GRU's final state: no per-word decomposition
    cfg["train"]["epochs"] = 1
    with pytest.raises(Exception, match="no per-word decomposition"):
        train(cfg, tmp_path / "x", progress=False)


def test_pointing_loss_is_the_mass_inside_the_boxes():
    maps = torch.tensor([[0.0, 1.0, 2.0, 3.0], [5.0, 0.0, 0.0, 0.0]])
    inside = torch.tensor([[False, False, False, True], [True, True, False, False]])
    z = (maps - maps.mean(1, keepdim=True)) / maps.std(1, keepdim=True) / 0.5
    p = torch.softmax(z, 1)
    want = -(torch.log(p[0, 3]) + torch.log(p[1, 0] + p[1, 1])) / 2
    torch.testing.assert_close(pointing_loss(maps, inside, 0.5), want)
    assert float(pointing_loss(maps, inside, 0.05)) < float(pointing_loss(-maps, inside, 0.05))


def test_target_cells_take_centres_inside_and_a_small_box_its_own_cell():
    cells = target_cells([(1, 1, 60, 40)], 90, 60, 3)  # the top-left 2 x 2 cells of a 3 x 3 grid
    assert cells.reshape(3, 3).tolist() == [[True, True, False], [True, True, False], [False] * 3]
    tiny = target_cells([(80, 50, 85, 55)], 90, 60, 3)  # holds no cell centre: the cell under its centre
    assert tiny.nonzero()[0].tolist() == [8]


def test_peak_form_asks_only_that_the_top_is_inside():
    inside = torch.tensor([[False, False, True, False]])
    right = torch.tensor([[0.0, 0.0, 5.0, 1.0]])  # peak inside, well above the rest
    wrong = torch.tensor([[0.0, 5.0, 1.0, 0.0]])
    assert float(pointing_loss(right, inside, 0.05, "peak")) == 0.0
    assert float(pointing_loss(wrong, inside, 0.05, "peak")) > 1.0
    everywhere = torch.ones(1, 4, dtype=torch.bool)
    assert float(pointing_loss(wrong, everywhere, 0.05, "peak")) == 0.0
    with pytest.raises(ValueError, match="mass or peak"):
        pointing_loss(right, inside, 0.2, "other")


@pytest.mark.parametrize("img_mlp", [False, True])
def test_the_grounding_term_reuses_the_matching_pass_and_its_gradients_equal_a_second_pass(img_mlp):
    """Inside shared_encodings the step runs the text encoder (and the image head) once; the loss and every
    gradient equal those of two separate passes (no dropout here, so the passes agree exactly)."""
    from vlmatch.data.vocab import Vocab
    from vlmatch.models.registry import create_model
    from vlmatch.training.grounding import grounding_term

    class Targets:  # two phrases of caption 0, one of caption 2, on a 2 x 2 grid
        def of_batch(self, caption_index):
            return (torch.tensor([0, 0, 2]), torch.tensor([[1, 2], [2, 4], [0, 1]]),
                    torch.tensor([[1, 0, 0, 0], [0, 1, 1, 0], [0, 0, 0, 1]], dtype=torch.bool))

    torch.manual_seed(0)
    model = create_model("vsepp", img_dim=6, embed_dim=8, word_dim=4, vocab_size=20, text_pool="mean",
                         img_mlp=img_mlp).double().train()
    model.vocab = Vocab.build(["a dog runs on the grass", "a red car"], min_count=1)
    tokens, lengths = model.tokenize(["a dog runs on", "a red car", "the grass"])
    feats = torch.randn(3, 4, 6, dtype=torch.float64)
    batch = {"caption_index": torch.tensor([0, 1, 2])}
    inputs = (feats, None, tokens, lengths)
    calls = []
    hooks = [model.txt_enc.register_forward_hook(lambda *_: calls.append("text")),
             model.img_fc.register_forward_hook(lambda *_: calls.append("image"))]

    def step(shared):
        model.zero_grad()
        calls.clear()
        if shared:
            with model.shared_encodings():
                loss = model(*inputs).diagonal().sum() + grounding_term(model, Targets(), batch, inputs, 0.2, "peak")
        else:
            loss = model(*inputs).diagonal().sum() + grounding_term(model, Targets(), batch, inputs, 0.2, "peak")
        loss.backward()
        return float(loss), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, list(calls)

    loss1, grads1, calls1 = step(shared=True)
    loss2, grads2, calls2 = step(shared=False)
    for h in hooks:
        h.remove()
    assert calls1.count("text") == 1 and calls2.count("text") == 2
    if img_mlp:  # the per-cell head runs once too (the linear side never projects every cell)
        assert calls1.count("image") == 1 and calls2.count("image") == 2
    assert abs(loss1 - loss2) < 1e-12 and grads1.keys() == grads2.keys()
    for name in grads1:
        torch.testing.assert_close(grads1[name], grads2[name], rtol=1e-10, atol=1e-12)
    assert "_shared_memo" not in model.__dict__  # nothing kept past the block


def _scan_cfg(data, ents, weight, direction="t2i"):
    cfg = _cfg(data, ents, weight)
    cfg["model"] = {"name": f"scan_{direction}_avg", "embed_dim": 16, "word_dim": 8, "lambda_softmax": 4}
    cfg["train"].update({"grounding_map": "attention", "epochs": 6})
    return cfg


@pytest.mark.slow  # a SCAN training each
@pytest.mark.parametrize("direction", ["t2i", "i2t"])
def test_grounding_on_attention_teaches_scans_own_attention_to_point(grid, tmp_path, direction):
    """train.grounding_map: attention trains the weights the paper shows (and `vlmatch grounding --method
    attention` scores): on held-out images they point where matching alone leaves them (wide margins)."""
    data, ents, dev_feats, dev_names = grid
    res = {}
    for weight in (0.0, 1.0):  # (5.0 is too strong for SCAN here: matching stalls)
        run = tmp_path / f"w{weight}"
        train(_scan_cfg(data, ents, weight, direction), run, progress=False)
        res[weight] = pointing_game(load_model(run / "best"), dev_feats, dev_names, ents, "attention")["pointing"]
    assert res[1.0] >= 95.0 and res[1.0] >= res[0.0] + 15.0, res  # 100 against 69.6 (t-i) / 54.6 (i-t) here


def test_grounding_on_attention_needs_a_model_with_attention(grid, tmp_path):
    data, ents, _, _ = grid
    cfg = _cfg(data, ents, 1.0)
    cfg["train"].update({"grounding_map": "attention", "epochs": 1})
    with pytest.raises(ConfigError, match="train.grounding_map: attention: model vsepp has no per-word attention"):
        train(cfg, tmp_path / "x", progress=False)


def test_a_row_showing_its_mirror_view_is_pulled_into_its_mirrored_boxes():
    """The grounding term of a batch whose row 0 shows its mirror view equals the term with that row's target
    cells mirrored by hand (on a 2 x 2 grid: columns swapped); the other rows keep theirs."""
    from vlmatch.data.vocab import Vocab
    from vlmatch.models.registry import create_model
    from vlmatch.training.grounding import grounding_term

    cells = torch.tensor([[1, 0, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]], dtype=torch.bool)

    class Targets:
        grid = 2

        def __init__(self, cells):
            self.cells = cells

        def of_batch(self, caption_index):
            return torch.tensor([0, 0, 2]), torch.tensor([[1, 2], [2, 4], [0, 1]]), self.cells

    torch.manual_seed(0)
    model = create_model("vsepp", img_dim=6, embed_dim=8, word_dim=4, vocab_size=20, text_pool="mean").double()
    model.vocab = Vocab.build(["a dog runs on the grass", "a red car"], min_count=1)
    tokens, lengths = model.tokenize(["a dog runs on", "a red car", "the grass"])
    inputs = (torch.randn(3, 4, 6, dtype=torch.float64), None, tokens, lengths)
    index = torch.tensor([0, 1, 2])
    flipped = grounding_term(model, Targets(cells), {"caption_index": index, "mirrored": torch.tensor([True, False,
                                                                                                        False])},
                             inputs, 0.2, "mass")
    by_hand = cells.clone()
    by_hand[:2] = cells[:2][:, [1, 0, 3, 2]]  # row 0's two phrases: left and right columns swapped
    want = grounding_term(model, Targets(by_hand), {"caption_index": index}, inputs, 0.2, "mass")
    plain = grounding_term(model, Targets(cells), {"caption_index": index, "mirrored": torch.zeros(3, dtype=bool)},
                           inputs, 0.2, "mass")
    assert flipped.item() == pytest.approx(want.item(), rel=1e-12)
    assert plain.item() != pytest.approx(flipped.item(), rel=1e-6)
