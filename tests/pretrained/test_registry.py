"""The registry of shipped models: names resolve to hash-checked checkpoint folders, everywhere a folder works."""

from __future__ import annotations

import json

import pytest
import torch

from vlmatch import create_model, load_model, pretrained
from vlmatch.checkpoints.seal import seal_checkpoint
from vlmatch.cli import main
from vlmatch.errors import ConfigError, DataError
from vlmatch.weights import sha256_file


@pytest.fixture
def shipped(tmp_path, monkeypatch):
    """A registry with one tiny trained-looking model, in place of the package's own."""
    weights = tmp_path / "weights"
    torch.manual_seed(0)
    model = create_model("vsepp", img_dim=12, embed_dim=8, word_dim=6, vocab_size=20)
    from vlmatch.data.vocab import Vocab

    model.vocab = Vocab.build(["a dog runs", "a red ball"], min_count=1)
    model.save(weights / "tiny")
    sha = sha256_file(weights / "tiny" / "model.safetensors")
    entry = {"name": "tiny", "model": "vsepp", "role": "retriever", "sha256": sha, "val_rsum": 12.5, "default": True,
             "checksums_sha256": sha256_file(weights / "tiny" / "checksums.json")}
    (tmp_path / "registry.json").write_text(json.dumps([entry]))
    monkeypatch.setattr(pretrained, "REGISTRY", tmp_path / "registry.json")
    monkeypatch.setattr(pretrained, "WEIGHTS", weights)
    return model


def test_pretrained_name_loads_exactly_the_checkpoint_folder(shipped):
    got = load_model("pretrained:tiny")
    want = load_model(pretrained.WEIGHTS / "tiny")
    feats = torch.randn(2, 3, 12)
    tokens, lengths = want.tokenize(["a dog", "a red ball runs"])
    with torch.no_grad():
        torch.testing.assert_close(got.score(got.encode_images(feats), got.encode_texts(tokens, lengths)),
                                   want.score(want.encode_images(feats), want.encode_texts(tokens, lengths)), atol=0, rtol=0)


def test_a_changed_weights_file_is_refused_in_one_line(shipped):
    f = pretrained.WEIGHTS / "tiny" / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-1] + b"\0")
    with pytest.raises(DataError, match="SHA-256 .* is not the registry's"):
        load_model("pretrained:tiny")


def test_unknown_names_and_a_missing_pair_say_what_exists(shipped):
    with pytest.raises(ConfigError, match="no pretrained model 'nope'; shipped: tiny"):
        load_model("pretrained:nope")
    assert pretrained.default_pair() == ("tiny", None)  # only a retriever ships: it is stage 1 and 2
    pretrained.REGISTRY.write_text("[]")
    with pytest.raises(ConfigError, match="ships no default model"):
        pretrained.default_pair()


def test_cli_lists_the_registry_as_a_table_and_as_json(shipped, capsys):
    assert main(["pretrained"]) == 0
    out = capsys.readouterr().out
    assert "tiny" in out and "retriever" in out and "12.5" in out
    assert main(["pretrained", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows[0]["name"] == "tiny" and rows[0]["sha256"] == pretrained.get("tiny").sha256
    assert {"name", "model", "role", "sha256", "val_rsum"} <= set(rows[0])
    with pytest.raises(SystemExit) as e:  # argparse's one error line, no traceback
        main(["evaluate", "--checkpoint", "pretrained:nope", "--data", "toyworld"])
    assert e.value.code == 2 and "no pretrained model 'nope'; shipped: tiny" in capsys.readouterr().err


def test_every_shipped_model_matches_its_hash_and_loads():
    for entry in pretrained.entries():  # the package's own registry
        model = load_model(f"pretrained:{entry.name}")
        assert model.name == entry.model and entry.role in ("retriever", "rescorer"), entry.name


def test_a_shipped_calibration_is_pinned_by_the_registry(shipped):
    from vlmatch.models.calibration import Calibration

    folder = pretrained.WEIGHTS / "tiny"
    weights = json.loads((folder / "config.json").read_text())["weights_sha256"]  # calibrations name their weights
    shipped.calibration = Calibration.fit(10.0, rank=4, text=torch.nn.functional.normalize(torch.randn(6, 8), dim=1))
    shipped.calibration.save(folder, weights_sha256=weights)
    with pytest.raises(DataError, match="calibration.safetensors: the registry records no calibration"):
        load_model("pretrained:tiny")
    reg = json.loads(pretrained.REGISTRY.read_text())
    reg[0]["calibration"] = {"beta": 10.0, "sha256": sha256_file(folder / "calibration.safetensors")}
    pretrained.REGISTRY.write_text(json.dumps(reg))
    with pytest.raises(DataError, match=r"tiny/calibration.json: not part of this checkpoint \(not listed in"):
        load_model("pretrained:tiny")  # the registry takes it, the folder's checksums.json does not
    reg[0]["checksums_sha256"] = seal_checkpoint(folder)
    pretrained.REGISTRY.write_text(json.dumps(reg))
    assert load_model("pretrained:tiny").calibration.beta == 10.0
    # replaced together with its own record (so calibration.json's hash agrees): the registry still refuses it
    Calibration.fit(99.0, rank=4, text=torch.nn.functional.normalize(torch.randn(6, 8), dim=1)).save(
        folder, weights_sha256=weights)
    with pytest.raises(DataError, match="calibration.safetensors: not the file the registry records"):
        load_model("pretrained:tiny")
    (folder / "calibration.safetensors").unlink()
    with pytest.raises(DataError, match="calibration.safetensors: not found for pretrained model 'tiny'"):
        load_model("pretrained:tiny")


def test_the_default_ships_a_calibration_that_fits_it():
    name, _ = pretrained.default_pair()
    entry = pretrained.get(name)
    model = load_model(f"pretrained:{name}")
    # the default ships one: the registry's record is the file it loads, and the val figures are the calibrated ones
    assert entry.calibration, f"the default model {name} ships no calibration"
    assert model.calibration is not None and model.calibration.beta == entry.calibration["beta"]
    assert entry.val["float16"]["rsum"] > entry.calibration["uncalibrated"]["rsum"]
