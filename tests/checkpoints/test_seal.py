"""A checkpoint folder is sealed whole: checksums.json lists every file, and a load refuses a folder whose parts
were deleted, added, edited or copied in from another checkpoint, naming the file in one line."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from vlmatch import load_model, pretrained
from vlmatch.checkpoints.seal import CHECKSUMS, verify_checkpoint
from vlmatch.cli import main
from vlmatch.data.vocab import Vocab
from vlmatch.errors import DataError
from vlmatch.models.calibration import Calibration
from vlmatch.models.registry import create_model
from vlmatch.weights import sha256_file


def _save(path, seed=0, beta=15.0, embed_dim=8):
    torch.manual_seed(seed)
    m = create_model("vsepp", img_dim=6, embed_dim=embed_dim, word_dim=4, vocab_size=12).eval()
    m.vocab = Vocab.build(["a dog runs on grass", "a red ball"], min_count=1)
    bank = torch.nn.functional.normalize(torch.randn(10, embed_dim, generator=torch.Generator().manual_seed(seed)), dim=1)
    m.calibration = Calibration.fit(beta, rank=4, text=bank)
    m.save(path)
    return m


def test_deleted_calibration_is_refused_not_run_uncalibrated(tmp_path):
    _save(tmp_path / "ck")
    (tmp_path / "ck" / "calibration.json").unlink()
    (tmp_path / "ck" / "calibration.safetensors").unlink()
    with pytest.raises(DataError, match=r"ck/calibration.json: missing, but listed in .*checksums.json"):
        load_model(tmp_path / "ck")


def test_an_edited_beta_is_refused(tmp_path):
    _save(tmp_path / "ck")
    rec_path = tmp_path / "ck" / "calibration.json"
    rec_path.write_text(json.dumps({**json.loads(rec_path.read_text()), "beta": 5.0}))  # its own sha256 still agrees
    with pytest.raises(DataError, match=r"ck/calibration.json: content does not match the SHA-256 recorded in "
                                        r".*checksums.json"):
        load_model(tmp_path / "ck")


def test_another_checkpoints_calibration_copied_in_is_refused(tmp_path):
    _save(tmp_path / "ck")
    _save(tmp_path / "other", seed=1, beta=9.0)  # same shapes: only the seal tells them apart
    for name in ("calibration.json", "calibration.safetensors"):
        shutil.copy(tmp_path / "other" / name, tmp_path / "ck" / name)
    with pytest.raises(DataError, match=r"ck/calibration.(json|safetensors): content does not match"):
        load_model(tmp_path / "ck")


def test_another_checkpoints_weights_and_config_copied_in_are_refused(tmp_path):
    _save(tmp_path / "ck")
    _save(tmp_path / "other", seed=1)
    for name in ("config.json", "model.safetensors"):  # a pair that agrees with itself (weights_sha256)
        shutil.copy(tmp_path / "other" / name, tmp_path / "ck" / name)
    with pytest.raises(DataError, match=r"ck/(config.json|model.safetensors): content does not match"):
        load_model(tmp_path / "ck")


def test_a_file_added_to_a_checkpoint_is_refused_but_hidden_files_are_not_parts(tmp_path):
    _save(tmp_path / "ck")
    (tmp_path / "ck" / ".vlmatch.lock").write_text("process 1\n")
    assert load_model(tmp_path / "ck") is not None
    (tmp_path / "ck" / "tokenizer").mkdir()
    (tmp_path / "ck" / "tokenizer" / "vocab.txt").write_text("a\n")
    with pytest.raises(DataError, match=r"ck/tokenizer/vocab.txt: not part of this checkpoint \(not listed in"):
        load_model(tmp_path / "ck")


def test_a_broken_checksums_file_is_named(tmp_path):
    _save(tmp_path / "ck")
    (tmp_path / "ck" / CHECKSUMS).write_text(json.dumps({"format": 1, "files": {"config.json": "x"}}))
    with pytest.raises(DataError, match=r"ck/checksums.json: not a checkpoint's checksums"):
        load_model(tmp_path / "ck")


def _as_older(folder):
    """``folder`` as vlmatch saved it before checkpoints were sealed: no format in config.json, a calibration
    that names no weights, no checksums.json."""
    cfg = json.loads((folder / "config.json").read_text())
    cfg.pop("format")
    (folder / "config.json").write_text(json.dumps(cfg))
    rec = json.loads((folder / "calibration.json").read_text())
    rec.pop("weights_sha256")
    (folder / "calibration.json").write_text(json.dumps(rec))
    (folder / CHECKSUMS).unlink()


def test_an_older_unsealed_checkpoint_loads_with_a_note_and_vlmatch_seal_seals_it(tmp_path, capsys):
    _save(tmp_path / "ck")
    _as_older(tmp_path / "ck")
    assert load_model(tmp_path / "ck").calibration is not None
    assert "has no checksums.json (saved by an older vlmatch)" in capsys.readouterr().err
    assert main(["seal", str(tmp_path / "ck")]) == 0
    assert verify_checkpoint(tmp_path / "ck") is not None
    (tmp_path / "ck" / "calibration.json").unlink()
    assert main(["seal", str(tmp_path / "ck")]) == 2  # a sealed folder that lost a part is not sealed again
    assert "calibration.json: missing" in capsys.readouterr().err


def test_a_checkpoint_saved_sealed_is_refused_without_its_seal(tmp_path):
    _save(tmp_path / "ck")
    (tmp_path / "ck" / CHECKSUMS).unlink()
    with pytest.raises(DataError, match=r"ck: has no checksums.json, but its config.json says format 2") as e:
        load_model(tmp_path / "ck")
    assert "\n" not in str(e.value)


def _foreign(folder, donor):
    for name in ("calibration.json", "calibration.safetensors"):
        shutil.copy(donor / name, folder / name)


def _beta_5(folder, donor):
    rec = json.loads((folder / "calibration.json").read_text())
    (folder / "calibration.json").write_text(json.dumps({**rec, "beta": 5.0}))


def _no_calibration(folder, donor):
    for name in ("calibration.json", "calibration.safetensors"):
        (folder / name).unlink()


CALIBRATED = [e for e in pretrained.entries() if e.calibration]


@pytest.mark.parametrize("entry", CALIBRATED, ids=lambda e: e.name)
@pytest.mark.parametrize("change", [_foreign, _beta_5, _no_calibration], ids=lambda f: f.__name__.strip("_"))
def test_a_shipped_checkpoint_without_its_seal_and_with_its_calibration_changed_is_refused(tmp_path, entry, change):
    """The probe's silent-wrong cases: checksums.json deleted from a copy of a shipped checkpoint, then
    another shipped model's calibration swapped in, beta edited, or both calibration files deleted."""
    donor = next(e for e in CALIBRATED if e.name != entry.name).folder
    ck = shutil.copytree(entry.folder, tmp_path / "ck")
    (ck / CHECKSUMS).unlink()
    change(ck, donor)
    with pytest.raises(DataError, match=r"ck: has no checksums.json, but its config.json says format 2") as e:
        load_model(ck)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("entry", CALIBRATED, ids=lambda e: e.name)
def test_a_foreign_calibration_with_checksums_recomputed_is_refused_and_not_sealed(tmp_path, entry, capsys):
    """checksums.json written again by hand (or by `vlmatch seal`) over another model's calibration: the
    calibration names the weights it was fitted for."""
    donor = next(e for e in CALIBRATED if e.name != entry.name).folder
    ck = shutil.copytree(entry.folder, tmp_path / "ck")
    _foreign(ck, donor)
    from vlmatch.checkpoints.seal import seal_checkpoint

    seal_checkpoint(ck)
    with pytest.raises(DataError, match=r"ck/calibration.json: fitted for other weights") as e:
        load_model(ck)
    assert "\n" not in str(e.value)
    (ck / CHECKSUMS).unlink()
    assert main(["seal", str(ck)]) == 2  # `vlmatch seal` refuses it too: saved sealed, it is never sealed again
    assert "has no checksums.json, but its config.json says format 2" in capsys.readouterr().err
    assert not (ck / CHECKSUMS).exists()


def test_a_calibration_naming_no_weights_is_refused_in_a_sealed_format_checkpoint(tmp_path):
    _save(tmp_path / "ck")
    rec_path = tmp_path / "ck" / "calibration.json"
    rec = json.loads(rec_path.read_text())
    rec.pop("weights_sha256")
    rec_path.write_text(json.dumps(rec))
    from vlmatch.checkpoints.seal import seal_checkpoint

    seal_checkpoint(tmp_path / "ck")
    with pytest.raises(DataError, match=r"calibration.json: records no weights_sha256"):
        load_model(tmp_path / "ck")


@pytest.mark.parametrize("entry", pretrained.entries(), ids=lambda e: e.name)
def test_every_shipped_folder_is_sealed_and_pinned_by_the_registry(entry):
    files = verify_checkpoint(entry.folder)
    assert files is not None and files["model.safetensors"] == entry.sha256
    assert sha256_file(entry.folder / CHECKSUMS) == entry.checksums_sha256
    if entry.calibration:
        assert files["calibration.safetensors"] == entry.calibration["sha256"]
        assert json.loads((entry.folder / "calibration.json").read_text())["weights_sha256"] == entry.sha256
    assert json.loads((entry.folder / "config.json").read_text())["format"] == 2
