"""One digest for a whole checkpoint folder: what an index records of the copies inside it
(:func:`checkpoint_digest`) and of the checkpoints a build was given (:func:`checkpoint_fingerprint`)."""

from __future__ import annotations

import json
import shutil

import pytest

from vlmatch.checkpoints.digest import checkpoint_digest, checkpoint_fingerprint
from vlmatch.checkpoints.seal import CHECKSUMS
from vlmatch.errors import DataError
from vlmatch.weights import sha256_file

from .test_seal import _save


def test_the_fingerprint_of_a_checkpoint_changes_with_its_calibration_alone(tmp_path):
    _save(tmp_path / "a", beta=15.0)
    _save(tmp_path / "b", beta=9.0)  # the same weights, another calibration
    assert sha256_file(tmp_path / "a" / "model.safetensors") == sha256_file(tmp_path / "b" / "model.safetensors")
    assert checkpoint_fingerprint(tmp_path / "a") != checkpoint_fingerprint(tmp_path / "b")


def test_the_digest_of_a_copy_is_the_same_and_another_calibration_changes_it(tmp_path):
    _save(tmp_path / "a", beta=15.0)
    _save(tmp_path / "b", beta=9.0)
    shutil.copytree(tmp_path / "a", tmp_path / "copy")
    assert checkpoint_digest(tmp_path / "copy") == checkpoint_digest(tmp_path / "a")
    assert checkpoint_digest(tmp_path / "b") != checkpoint_digest(tmp_path / "a")


def test_the_digest_checks_the_folder_whole_first_and_needs_the_weights_hash(tmp_path):
    _save(tmp_path / "a")
    rec = tmp_path / "a" / "calibration.json"
    rec.write_text(json.dumps({**json.loads(rec.read_text()), "beta": 5.0}))
    with pytest.raises(DataError, match=r"a/calibration.json: content does not match the SHA-256 recorded in"):
        checkpoint_digest(tmp_path / "a")
    _save(tmp_path / "b")
    (tmp_path / "b" / CHECKSUMS).unlink()  # an unsealed copy: config.json must still record the weights' hash
    cfg = json.loads((tmp_path / "b" / "config.json").read_text())
    (tmp_path / "b" / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if k != "weights_sha256"}))
    with pytest.raises(DataError, match=r"b/config.json: records no weights_sha256"):
        checkpoint_digest(tmp_path / "b")
