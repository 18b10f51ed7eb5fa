"""A checkpoint folder is sealed whole: checksums.json lists every file, and a load refuses a folder whose parts
were deleted, added, edited or copied in from another checkpoint, naming the file in one line."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from vlmatch import load_model, pretrained
from vlmatch.cli import main
from vlmatch.data.vocab import Vocab
from vlmatch.errors import DataError
from vlmatch.models.calibration import Calibration
from vlmatch.models.registry import create_model
from vlmatch.models.sealing import CHECKSUMS, checkpoint_fingerprint, verify_checkpoint
from vlmatch.weights import sha256_file


def _save(path, seed=0, beta=15.0, embed_dim=8):
    torch.manual_seed(seed)
    m = create_model("vsepp", img_dim=6, embed_dim=embed_dim, word_dim=4, vocab_size=12).eval()
    m.vocab = Vocab.build(["a dog runs on grass", "a red ball"], min_count=1)
    bank = torch.nn.functional.normalize(torch.randn(10, embed_dim, generator=torch.Generator().manual_seed(seed)), dim=1)
    m.calibration = Calibration.fit(beta, rank=4, text=bank)
    m.save(path)
    return m


def test_save_lists_every_file_and_a_whole_folder_loads(tmp_path):
    _save(tmp_path / "ck")
    listed = json.loads((tmp_path / "ck" / CHECKSUMS).read_text())["files"]
    assert set(listed) == {"model.safetensors", "config.json", "vocab.json", "calibration.json",
                           "calibration.safetensors"}
    assert listed["calibration.json"] == sha256_file(tmp_path / "ck" / "calibration.json")
    assert load_model(tmp_path / "ck").calibration.beta == 15.0


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


def test_an_unsealed_checkpoint_loads_with_a_note_and_vlmatch_seal_seals_it(tmp_path, capsys):
    _save(tmp_path / "ck")
    (tmp_path / "ck" / CHECKSUMS).unlink()  # saved by an older vlmatch
    assert load_model(tmp_path / "ck").calibration is not None
    assert "has no checksums.json (saved by an older vlmatch)" in capsys.readouterr().err
    assert main(["seal", str(tmp_path / "ck")]) == 0
    assert verify_checkpoint(tmp_path / "ck") is not None
    (tmp_path / "ck" / "calibration.json").unlink()
    assert main(["seal", str(tmp_path / "ck")]) == 2  # a sealed folder that lost a part is not sealed again
    assert "calibration.json: missing" in capsys.readouterr().err


def test_the_fingerprint_of_a_checkpoint_changes_with_its_calibration_alone(tmp_path):
    _save(tmp_path / "a", beta=15.0)
    _save(tmp_path / "b", beta=9.0)  # the same weights, another calibration
    assert sha256_file(tmp_path / "a" / "model.safetensors") == sha256_file(tmp_path / "b" / "model.safetensors")
    assert checkpoint_fingerprint(tmp_path / "a") != checkpoint_fingerprint(tmp_path / "b")


@pytest.mark.parametrize("entry", pretrained.entries(), ids=lambda e: e.name)
def test_every_shipped_folder_is_sealed_and_pinned_by_the_registry(entry):
    files = verify_checkpoint(entry.folder)
    assert files is not None and files["model.safetensors"] == entry.sha256
    assert sha256_file(entry.folder / CHECKSUMS) == entry.checksums_sha256
    if entry.calibration:
        assert files["calibration.safetensors"] == entry.calibration["sha256"]
