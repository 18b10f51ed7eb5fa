"""train.compile: training steps and validation run the model's score through torch.compile -- the same
losses and weights as eager training to float rounding."""

import json

import pytest
import torch

from vlmatch import load_model
from vlmatch.training.config import load_config
from vlmatch.training.loop import train


# A batch of 8: Inductor's CPU code guards on captions' words x batch^2 > 4096 (need_use_acc_helper), so at 16 a
# batch of captions over 16 words compiled the training step a second time (TORCH_LOGS=recompiles); the toy
# world's captions stay under 64 words.
def _cfg(world, **train_over):
    extra = {"model": {"name": "caan", "embed_dim": 16, "word_dim": 8, "attn_dim": 8},
             "data": {"path": str(world), "val_max_images": 40, "min_word_count": 1},
             "train": {"epochs": 2, "batch_size": 8, "lr": 1e-3, "log_every": 1, "warmup_epochs": 1,
                       "max_steps_per_epoch": 4, "threads": 1, **train_over}}
    return load_config(None, extra=extra)


def _losses(run):
    return [json.loads(ln)["loss"] for ln in (run / "metrics.jsonl").read_text().splitlines()
            if json.loads(ln)["type"] == "train"]


@pytest.mark.slow  # Inductor compiles CAAN's training step once and the engine's validation scoring
def test_compiled_training_equals_eager_to_float_rounding(small_world, tmp_path, capsys):
    pytest.importorskip("torch._inductor")
    # Inductor's on-disk cache is the test session's own (tests/conftest.py): kernels cached by an AVX-512 process
    # and loaded by one held to AVX2 gave CAAN non-finite scores (the trainer then falls back to eager, which
    # this test forbids).
    torch._dynamo.reset()
    eager, compiled = tmp_path / "eager", tmp_path / "compiled"
    train(_cfg(small_world), eager, progress=False)
    train(_cfg(small_world, compile=True), compiled, progress=False)
    assert "torch.compile failed" not in capsys.readouterr().err  # CAAN's graph compiles: no fallback to eager
    a, b = _losses(eager), _losses(compiled)
    assert len(a) == len(b) == 8  # both epochs: the warm-up sum over all negatives, then hardest negatives
    assert b == pytest.approx(a, rel=1e-3)
    # Adam divides by the gradients' scale: an element whose gradient is float noise may move by up to lr
    # in either run, so each weight tensor is compared as a whole (relative distance), not element-wise
    wa, wb = load_model(eager / "last").state_dict(), load_model(compiled / "last").state_dict()
    for k in wa:
        assert float((wb[k] - wa[k]).norm()) <= 1e-3 * float(wa[k].norm()) + 1e-6, k
    assert (compiled / "best" / "metrics.json").is_file()  # validation ran (the engine's compiled path) each epoch


def _falls_back_once(monkeypatch, capsys, compiler, said):
    """A small VSE++ scored through ``compiled_score`` with ``compiler`` as torch.compile: both calls give
    the eager scores, and the note (``said`` in it) is printed once."""
    from vlmatch import create_model
    from vlmatch.training.loop import compiled_score

    monkeypatch.setattr(torch, "compile", compiler)
    torch.manual_seed(0)
    model = create_model("vsepp", img_dim=12, embed_dim=8, word_dim=7, vocab_size=30)
    img = model.encode_images(torch.randn(3, 5, 12))
    txt = model.encode_texts(torch.tensor([[1, 2, 3], [4, 5, 0]]), torch.tensor([3, 2]))
    score = compiled_score(model)
    torch.testing.assert_close(score(img, txt), model.score(img, txt))
    torch.testing.assert_close(score(img, txt), model.score(img, txt))
    err = capsys.readouterr().err
    assert err.count("torch.compile failed") == 1 and said in err and len(score.failed) == 1
    return img, txt


def test_a_graph_inductor_cannot_compile_trains_on_eagerly(monkeypatch, capsys):
    """MMCA's cross unit is one such graph on torch 2.13 (a symbolic-shape error on the first call): the run
    goes on with the eager score and says so in one line, instead of dying."""
    def broken(fn, **kw):
        def call(*a):
            raise TypeError("cannot determine truth value of Relational")
        return call

    _falls_back_once(monkeypatch, capsys, broken, "training on eagerly")


def test_compiled_scores_that_are_not_finite_fall_back_to_eager(monkeypatch, capsys):
    """Compiled code that gives NaN where the eager score is finite must not poison the weights (CAAN got
    such code from Inductor's cache: kernels of an AVX-512 process, run with ATEN_CPU_CAPABILITY=avx2):
    that batch and the rest of the run are scored eagerly, with a one-line note. A model whose own scores
    are non-finite is not the compiler's fault: those pass through unchanged."""
    from vlmatch import create_model
    from vlmatch.training.loop import compiled_score

    def nan_compiler(fn, **kw):
        def call(*a):
            return fn(*a) * float("nan")
        return call

    img, txt = _falls_back_once(monkeypatch, capsys, nan_compiler, "non-finite")
    bad = create_model("vsepp", img_dim=12, embed_dim=8, word_dim=7, vocab_size=30)
    monkeypatch.setattr(bad, "score", lambda i, t: torch.full((3, 2), float("nan")))
    score = compiled_score(bad)
    assert torch.isnan(score(img, txt)).all() and not score.failed
