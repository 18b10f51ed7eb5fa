"""`vlmatch seal` records only a folder saved by an older vlmatch: on copies of the shipped default with checksums.json
deleted, whatever was changed in them (beta, the calibration bank with its sha256 fixed, LoRA weights swapped with
config.json's weights_sha256 fixed, the weights edited, the calibration deleted) is refused in one line and no seal is
written. A config.json whose format was removed beside a calibration that names its weights (which only format 2
writes) is a downgrade: refused by a load, by `vlmatch seal` and by release/ship.py --reseal alike."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

import vlmatch
from tests.benchmark_scripts import load_script
from vlmatch import load_model, pretrained
from vlmatch.checkpoints.seal import CHECKSUMS
from vlmatch.errors import DataError
from vlmatch.weights import sha256_file

SRC = Path(vlmatch.__file__).resolve().parents[1]
DEFAULT = next(e for e in pretrained.entries() if e.default and e.role == "retriever")


def _seal(folder) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "vlmatch.cli", "seal", str(folder)], capture_output=True, text=True,
                          env=env, timeout=300)


def _edit_json(path, **changes):
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}, indent=2))


def _beta_5(ck):
    _edit_json(ck / "calibration.json", beta=5.0)


def _bank_edited(ck):  # the bank changed, calibration.json's own sha256 fixed to agree
    bank = load_file(str(ck / "calibration.safetensors"))
    key = next(k for k in sorted(bank) if k.endswith("_scale"))
    bank[key] = bank[key] * 3
    save_file(bank, str(ck / "calibration.safetensors"))
    _edit_json(ck / "calibration.json", sha256=sha256_file(ck / "calibration.safetensors"))


def _lora_swapped(ck):  # the LoRA adapters replaced, config.json's (and the calibration's) weights_sha256 fixed
    state = load_file(str(ck / "model.safetensors"))
    lora = sorted(k for k in state if "lora" in k.lower())
    assert lora, "the default ships LoRA adapters"
    for k in lora:
        state[k] = state[k].flip(0)
    save_file(state, str(ck / "model.safetensors"))
    digest = sha256_file(ck / "model.safetensors")
    _edit_json(ck / "config.json", weights_sha256=digest)
    _edit_json(ck / "calibration.json", weights_sha256=digest)


def _weights_edited(ck):
    data = bytearray((ck / "model.safetensors").read_bytes())
    data[-2:] = bytes(b ^ 0x55 for b in data[-2:])
    (ck / "model.safetensors").write_bytes(bytes(data))


def _calibration_deleted(ck):
    (ck / "calibration.json").unlink()
    (ck / "calibration.safetensors").unlink()


CHANGES = [_beta_5, _bank_edited, _lora_swapped, _weights_edited, _calibration_deleted]


def _copy(tmp_path, change=None, downgrade=False) -> Path:
    ck = shutil.copytree(DEFAULT.folder, tmp_path / "ck")
    (ck / CHECKSUMS).unlink()
    if change is not None:
        change(ck)
    if downgrade:  # config.json as an older vlmatch wrote it: no format
        cfg = json.loads((ck / "config.json").read_text())
        cfg.pop("format")
        (ck / "config.json").write_text(json.dumps(cfg, indent=2))
    return ck


def _files(folder) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


@pytest.mark.slow  # seconds per case
@pytest.mark.parametrize("change", CHANGES, ids=lambda f: f.__name__.strip("_"))
def test_seal_refuses_a_sealed_folder_that_lost_its_seal_whatever_changed(tmp_path, change):
    ck = _copy(tmp_path, change)
    before = _files(ck)
    r = _seal(ck)
    err = r.stderr.strip()
    assert r.returncode == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert f"{ck}: has no checksums.json, but its config.json says format 2" in err, err
    assert "records only folders saved by an older vlmatch" in err and "restore the checkpoint whole" in err
    assert not (ck / CHECKSUMS).exists() and _files(ck) == before


@pytest.mark.slow  # seal and load, each in a process of its own, four times
@pytest.mark.parametrize("change", [None, _beta_5, _bank_edited, _lora_swapped], ids=lambda f: getattr(
    f, "__name__", "unchanged").strip("_"))
def test_a_downgraded_folder_is_refused_by_seal_and_by_a_load(tmp_path, change):
    ck = _copy(tmp_path, change, downgrade=True)
    before = _files(ck)
    r = _seal(ck)
    err = r.stderr.strip()
    assert r.returncode == 2 and len(err.splitlines()) == 1, err
    assert f"{ck / 'config.json'}: records no format" in err and "calibration.json records weights_sha256" in err, err
    assert not (ck / CHECKSUMS).exists() and _files(ck) == before
    with pytest.raises(DataError, match=r"records no format \(as an older vlmatch saved them\), but calibration.json "
                                        r"records weights_sha256, which only format 2 writes") as e:
        load_model(ck)
    assert "\n" not in str(e.value) and "vlmatch seal" not in str(e.value)


def test_the_load_error_of_a_lost_seal_does_not_suggest_sealing(tmp_path):
    ck = _copy(tmp_path)
    with pytest.raises(DataError, match="has no checksums.json") as e:
        load_model(ck)
    assert "vlmatch seal" not in str(e.value) and "restore the checkpoint whole" in str(e.value)


@pytest.mark.slow  # seconds
def test_a_format_no_vlmatch_writes_is_refused(tmp_path):
    ck = _copy(tmp_path)
    _edit_json(ck / "config.json", format=1)
    r = _seal(ck)
    assert r.returncode == 2 and "records format 1, which no vlmatch writes" in r.stderr, r.stderr
    assert not (ck / CHECKSUMS).exists()


def test_ship_reseal_refuses_a_downgraded_shipped_folder_and_writes_nothing(tmp_path, monkeypatch):
    ship = load_script("ship", "release_ship_reseal")
    good = shutil.copytree(DEFAULT.folder, tmp_path / "good")
    bad = _copy(tmp_path, _beta_5, downgrade=True)
    entries = [pretrained.Pretrained(**{**DEFAULT.__dict__, "name": "good"}),
               pretrained.Pretrained(**{**DEFAULT.__dict__, "name": "bad"})]
    folders = {"good": good, "bad": bad}
    monkeypatch.setattr(type(entries[0]), "folder", property(lambda e: folders[e.name]))
    monkeypatch.setattr(ship, "PRETRAINED", tmp_path / "pretrained")
    monkeypatch.setattr(pretrained, "entries", lambda: entries)
    before = {"good": _files(good), "bad": _files(bad)}
    with pytest.raises(SystemExit) as e:
        ship.reseal_all()
    assert str(e.value).startswith("not resealed: ") and "records no format" in str(e.value)
    assert {"good": _files(good), "bad": _files(bad)} == before and not (tmp_path / "pretrained").exists()
