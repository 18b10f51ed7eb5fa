"""A reader never sees a mix of two versions of an index: ``Index.open`` racing a rebuild (another
re-scorer; another re-scorer and retriever) or an update of the same folder gives the old index or the
new one, whole, at every step of the writer.

The race is made deterministic with two threads. The writer pauses at one step: before its first swap
(its encoding done), or at each named step of the swap (:data:`vlmatch.io.crash_hook`). A reader starts
opening and stops just before its first, second or third load (model, retriever, image collection);
then the writer goes on, to its end or until it waits for the reader (``swap:wait``), and only then does
the reader load. Before readers and writers shared ``.vlmatch.read.lock``, a reader stopped there loaded
the new files under the old manifest's records: a ranking neither version gives."""

import shutil
import threading

import pytest

import vlmatch
from vlmatch import io
from vlmatch.models import registry
from vlmatch.search import build as build_module
from vlmatch.search import index as index_module

from .test_index_safety import NAMES, build, ckpts  # noqa: F401  (the module fixture)
from .tiny import Scores, jpegs, tiny_backbone  # noqa: F401  (autouse)

WAIT = 120  # seconds: a step that never comes fails the test instead of hanging it
LOADS = ("model", "retriever", "images")


def ranking(idx, q="a red dog"):
    return Scores({r.path: r.score for r in idx.search(q, k=len(idx), candidates=len(idx))})


def scenario(kind, ckpts, tmp_path):  # noqa: F811
    """(pristine old index folder, a function writing the new version into a folder, old and new rankings)."""
    imgs = jpegs(tmp_path / "imgs", NAMES)
    old = tmp_path / "old"
    assert build(ckpts, imgs, old) == 0
    if kind == "update":
        def write(out):
            from vlmatch.cli import main

            assert main(["index", "update", str(out), "--no-progress"]) == 0
        ref_old = ranking(vlmatch.Index.open(old))
        jpegs(imgs, ["new0.jpg", "new1.jpg"], seed=3)
        (imgs / "im5.jpg").unlink()
        assert build(ckpts, imgs, tmp_path / "ref_new") == 0
    else:
        other = {"model": "b"} if kind == "rescorer" else {"model": "b", "retriever": "vsepp_b"}

        def write(out):
            assert build(ckpts, imgs, out, **other) == 0
        ref_old = ranking(vlmatch.Index.open(old))
        assert build(ckpts, imgs, tmp_path / "ref_new", **other) == 0
    ref_new = ranking(vlmatch.Index.open(tmp_path / "ref_new"))
    assert ref_old != ref_new
    return old, write, ref_old, ref_new


class Race:
    """One writer thread paused at its ``pause``-th step, one reader thread stopped before its ``load``."""

    def __init__(self, monkeypatch, out, write, pause: int, load: str | None):
        self.out, self.pause, self.load = out, pause, load
        self.steps: list[str] = []
        self.ev = {name: threading.Event() for name in ("paused", "go", "writer_waits", "at_load", "load_go",
                                                         "reader_waits")}
        self.writer = threading.Thread(target=self._run, args=(write, out), daemon=True)
        self.reader = threading.Thread(target=self._open, daemon=True)
        self.errors: list[BaseException] = []
        self.opened = None
        monkeypatch.setattr(io, "crash_hook", self._hook)
        real_stage1, real_load, real_collection = build_module.stage1_of, registry.load_model, index_module.FolderCollection

        def stage1_of(*a, **k):  # the writer's encoding is done: the last call before its swap
            if threading.current_thread() is self.writer and "before-swap" not in self.steps:
                self._step("before-swap")
            return real_stage1(*a, **k)

        def load_model(*a, **k):
            self._before_load("retriever" if "model" in self.loaded else "model")
            return real_load(*a, **k)

        def collection(folder, *a, **k):
            if folder.name.removesuffix(".prev") == "images":
                self._before_load("images")
            return real_collection(folder, *a, **k)

        self.loaded: list[str] = []
        monkeypatch.setattr(build_module, "stage1_of", stage1_of)
        monkeypatch.setattr(registry, "load_model", load_model)
        monkeypatch.setattr(index_module, "FolderCollection", collection)  # what Index opens its parts with

    def _run(self, fn, *args):
        try:
            fn(*args)
        except BaseException as e:  # noqa: BLE001 -- reported by the test
            self.errors.append(e)
        finally:
            self.ev["paused"].set()  # a writer with fewer steps than asked ends unpaused

    def _open(self):
        try:
            self.opened = vlmatch.Index.open(self.out)
        except BaseException as e:  # noqa: BLE001
            self.errors.append(e)

    def _step(self, name):
        self.steps.append(name)
        if len(self.steps) == self.pause:
            self.ev["paused"].set()
            assert self.ev["go"].wait(WAIT), "the writer was never released"

    def _hook(self, name):
        me = threading.current_thread()
        if me is self.writer:
            if name == "swap:wait":
                self.ev["writer_waits"].set()
            else:
                self._step(name)
        elif me is self.reader and name == "open:wait":
            self.ev["reader_waits"].set()

    def _before_load(self, what):
        if threading.current_thread() is not self.reader:
            return
        self.loaded.append(what)
        if what == self.load:
            self.ev["at_load"].set()
            assert self.ev["load_go"].wait(WAIT), "the reader was never released"

    def run(self):
        self.writer.start()
        assert self.ev["paused"].wait(WAIT)
        if not self.writer.is_alive():
            return "writer ended"
        self.reader.start()
        _first(self.ev["at_load"], self.ev["reader_waits"], alive=self.reader)
        if self.ev["at_load"].is_set():  # the reader resolved the parts: the writer commits now, if it can
            self.ev["go"].set()
            _first(self.ev["writer_waits"], alive=self.writer)
            self.ev["load_go"].set()
        else:  # the writer holds the parts: the reader waits for its commit
            self.ev["load_go"].set()
            self.ev["go"].set()
        self.reader.join(WAIT)
        self.writer.join(WAIT)
        assert not self.reader.is_alive() and not self.writer.is_alive(), "deadlock"
        assert not self.errors, self.errors
        return "raced"


def _first(*events, alive):
    """Wait until one of ``events`` is set or the thread ``alive`` ends."""
    for _ in range(WAIT * 100):
        if any(e.is_set() for e in events) or not alive.is_alive():
            return
        events[0].wait(0.01)
    raise AssertionError("neither step came")


@pytest.fixture(scope="module")
def scenarios(ckpts, tmp_path_factory):  # noqa: F811
    """``scenario(kind)``, built once per kind for the module (two index builds; each race copies the old folder)."""
    made = {}

    def get(kind):
        if kind not in made:
            made[kind] = scenario(kind, ckpts, tmp_path_factory.mktemp(f"scenario_{kind}"))
        return made[kind]
    return get


def race(monkeypatch, made, tmp_path, pause, load, every_step=False):
    old, write, ref_old, ref_new = made
    seen = []
    while True:
        out = tmp_path / f"idx{pause}"
        shutil.copytree(old, out)
        with monkeypatch.context() as m:
            r = Race(m, out, write, pause, load)
            if r.run() == "writer ended":
                break
        assert load in r.loaded, f"the reader never reached its {load!r} load (it loaded {r.loaded})"
        got = ranking(r.opened)
        assert got in (ref_old, ref_new), f"a mixed index with the writer paused at {r.steps[pause - 1]!r}"
        assert ranking(vlmatch.Index.open(out)) == ref_new  # and the writer's version stands after
        seen.append((r.steps[pause - 1], "old" if got == ref_old else "new"))
        pause += 1
        if not every_step:
            break
    return seen


@pytest.mark.parametrize("load", LOADS)
@pytest.mark.parametrize("kind", ["rescorer", "both", "update"])
def test_a_reader_that_straddles_a_commit_opens_one_version(monkeypatch, scenarios, tmp_path, kind, load):
    """The writer paused with its encoding done (before its first swap); the reader stops before ``load``."""
    seen = race(monkeypatch, scenarios(kind), tmp_path, 1, load)
    assert seen[0] == ("before-swap", "old")  # the reader holds the old version: the writer waits for it


@pytest.mark.slow  # readers in processes of their own
@pytest.mark.parametrize("kind", ["rescorer", "both", "update"])
def test_a_reader_opening_at_any_step_of_a_swap_opens_one_version(monkeypatch, scenarios, tmp_path, kind):
    """The writer paused at each step of its swap and commit in turn: the reader waits for the commit."""
    seen = race(monkeypatch, scenarios(kind), tmp_path, 2, "model", every_step=True)  # it waits before any load
    steps = [s for s, _ in seen]
    assert steps[-2:] == ["commit:parts", "commit:manifest"] and len(steps) >= (6 if kind == "update" else 14)
    assert {v for _, v in seen} == {"new"}
