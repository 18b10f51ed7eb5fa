"""Config validation: declared types and ranges for every section and model option, up front."""

from dataclasses import dataclass, field
from typing import Literal

import pytest

from vlmatch import create_model
from vlmatch.cli import main
from vlmatch.errors import ConfigError
from vlmatch.models import registry
from vlmatch.models.vse import VSE, VSEConfig
from vlmatch.options import option
from vlmatch.training.config import check_config, load_config


def test_numbers_in_any_yaml_spelling(tmp_path):
    # PyYAML alone reads 1e-4 as the string '1e-4' (the example `vlmatch train --help` prints crashed)
    cfg = load_config(None, ["train.lr=1e-4", "train.batch_size=1e2", "train.margin=2E-1"])
    assert cfg["train"]["lr"] == 1e-4 and isinstance(cfg["train"]["lr"], float)
    assert cfg["train"]["batch_size"] == 100 and isinstance(cfg["train"]["batch_size"], int)
    assert cfg["train"]["margin"] == 0.2
    f = tmp_path / "c.yaml"
    f.write_text("model: {name: scan_t2i_avg, lambda_softmax: 9, embed_dim: 1.6e1}\ntrain: {lr: 2.e-4, grad_clip: 2}\n")
    cfg = load_config(str(f))
    assert cfg["train"]["lr"] == 2e-4 and cfg["train"]["grad_clip"] == 2.0 and isinstance(cfg["train"]["grad_clip"], float)
    assert cfg["model"]["embed_dim"] == 16 and isinstance(cfg["model"]["embed_dim"], int)
    assert cfg["model"]["lambda_softmax"] == 9.0


def test_every_problem_is_reported_once_in_one_message(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text('model: {name: scan_t2i_avg, bi_gru: "false", embed_dim: "32", direction: foo}\n'
                 "data: {val_max_images: 0}\n"
                 "train: {log_every: 0, lr_update: 0, device: tpu, lr: -1, batch_size: -4, epochs: 0}\n")
    with pytest.raises(ConfigError) as e:
        load_config(str(f))
    msg = str(e.value)
    assert msg.startswith(f"{f}: 10 problems in the config:")
    for line in ("model.bi_gru must be true or false, got the string 'false'",
                 "model.embed_dim must be an integer >= 1", "got the string '32'",
                 "model.direction must be one of t2i, i2t; got the string 'foo'",
                 "data.val_max_images must be >= 1, got 0", "train.log_every must be >= 1, got 0",
                 "train.lr_update must be >= 1, got 0", "train.lr must be > 0, got -1.0",
                 "train.batch_size must be >= 1, got -4", "train.epochs must be >= 1, got 0",
                 "train.device must be auto, cpu, cuda or cuda:N"):
        assert line in msg
    assert len(msg.splitlines()) == 11


@pytest.mark.parametrize("item, expected", [
    ("train.max_violation=1", "train.max_violation must be true or false, got 1"),
    ("train.max_violation=yes please", "train.max_violation must be true or false, got the string 'yes please'"),
    ("train.lr=.nan", "train.lr must be a finite number"),
    ("train.workers=1.5", "train.workers must be an integer >= 0, got 1.5"),
    ("data.train_split=3", "data.train_split must be a string, got 3"),
    ("data.check_finite=null", "data.check_finite must be true or false, got null"),
    ("model.gemm_dtype=float32", "model 'vsepp' has no option(s) ['gemm_dtype']"),
    ("model.name=nope", "unknown model 'nope'"),
])
def test_strict_types(item, expected):
    with pytest.raises(ConfigError) as e:
        load_config(None, [item])
    assert expected in str(e.value)


def test_bad_values_stop_the_cli_before_any_work(small_world, tmp_path, capsys):
    run = tmp_path / "run"
    for bad in ("train.batch_size=-4", "train.epochs=0", 'model.bi_gru="false"', "train.device=tpu"):
        assert main(["train", "--config", "quickstart_vsepp", "--set", f"data.path={small_world}", "--set", bad,
                     "--run-dir", str(run), "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err and bad.split("=")[0] in err
        assert not run.exists()  # refused before the run folder (or anything else) was made


@dataclass
class _NewConfig(VSEConfig):
    """A model added later: validated from its annotations alone."""

    mode: Literal["fast", "slow"] = "fast"
    heads: int = 2
    temperature: float = option(1.0, min=0.01, max=100.0)
    hidden_layers: int = 1
    keep: float | None = None
    dims: list[int] = field(default_factory=lambda: [4, 4])

    def __post_init__(self):
        if self.embed_dim % self.heads:
            raise ValueError(f"embed_dim ({self.embed_dim}) must be a multiple of heads ({self.heads})")


@pytest.fixture
def new_model():
    class _New(VSE):
        Config = _NewConfig

    registry.register("_new_test_model", _New, "test")
    yield "_new_test_model"
    registry._REGISTRY.pop("_new_test_model")


def test_a_new_models_options_are_checked_from_its_config(new_model):
    cases = {"mode": ("medium", "model.mode must be one of fast, slow; got the string 'medium'"),
             "heads": (0, "model.heads must be >= 1 and <= 16777216, got 0"),
             "temperature": (1000, "model.temperature must be >= 0.01 and <= 100.0, got 1000.0"),
             "hidden_layers": ("2", "got the string '2'"),
             "keep": ("0.5", "model.keep must be a number or null, got the string '0.5'"),
             "dims": ([4, "x"], "model.dims item 1 must be an integer, got the string 'x'")}
    for key, (value, expected) in cases.items():
        with pytest.raises(ConfigError) as e:
            create_model(new_model, **{key: value})
        assert expected in str(e.value), str(e.value)
        with pytest.raises(ConfigError) as e:  # the same through a config, before building anything
            check_config({**load_config(None), "model": {"name": new_model, key: value}})
        assert expected in str(e.value)
    with pytest.raises(ConfigError, match=r"embed_dim \(30\) must be a multiple of heads \(4\)"):
        check_config({**load_config(None), "model": {"name": new_model, "embed_dim": 30, "heads": 4}})
    m = create_model(new_model, img_dim=4, embed_dim=8, word_dim=4, vocab_size=10, keep=0.5, temperature=5)
    assert m.cfg.temperature == 5.0 and isinstance(m.cfg.temperature, float)


def test_every_bundled_config_is_valid():
    from vlmatch.training.config import BUNDLED

    names = sorted(p.stem for p in BUNDLED.glob("*.yaml"))
    assert len(names) > 10
    for name in names:
        cfg = load_config(name)
        assert check_config(cfg) == cfg, name  # already normalised


def _bundled_claims(module) -> list[tuple[list[str], dict]]:
    """The "Bundled configs" block of a model module's docstring: one (config name globs, {option: value})
    per indented line, e.g. ``    sman*_f30k, sman*_coco    score_mode: concat, grid_pool: 2``."""
    import re

    from vlmatch.training.config import parse_yaml

    lines = module.__doc__.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Bundled configs"))
    claims = []
    for line in lines[start + 1:]:
        if not line.startswith("    "):
            break
        globs, settings = re.split(r"\s{2,}", line.strip(), maxsplit=1)
        claims.append(([g.strip() for g in globs.split(",")],
                       {k: parse_yaml(v) for k, v in (kv.split(": ") for kv in settings.split(", "))}))
    assert claims, f"{module.__name__}: an empty 'Bundled configs' block"
    return claims


@pytest.mark.parametrize("module_name", ["caan", "mtfn", "sman"])
def test_every_bundled_config_of_a_model_sets_what_its_docstring_says(module_name):
    """Each bundled config of the module's models resolves (registered defaults + its YAML) to the options
    its docstring's "Bundled configs" block states, and no such config is left out of the block."""
    import importlib
    from fnmatch import fnmatch

    from vlmatch.models.base import MatchingModel
    from vlmatch.training.config import BUNDLED

    module = importlib.import_module(f"vlmatch.models.{module_name}")
    claims = _bundled_claims(module)
    classes = {c for c in vars(module).values()
               if isinstance(c, type) and issubclass(c, MatchingModel) and c.__module__ == module.__name__}
    checked = 0
    for stem in sorted(p.stem for p in BUNDLED.glob("*.yaml")):
        model = load_config(stem)["model"]
        if registry.model_class(model["name"]) not in classes:
            continue
        cfg = registry.model_config(model["name"], {k: v for k, v in model.items() if k != "name"})
        lines = [settings for globs, settings in claims if any(fnmatch(stem, g) for g in globs)]
        assert lines, f"{stem}: no line of {module.__name__}'s 'Bundled configs' covers it"
        for settings in lines:
            for key, value in settings.items():
                assert getattr(cfg, key) == value, f"{stem}: {key} = {getattr(cfg, key)!r}, the docstring says {value!r}"
        checked += 1
    assert checked >= 3


# The models' own __init__ re-checks of these options are gone: the option check refuses a bad value before any
# model is built, in one line (through create_model, a config file, --set, and a checkpoint's config.json alike).
REFUSED = [
    ("scan_t2i_avg", "direction", "up", "model.direction must be one of t2i, i2t; got the string 'up'"),
    ("scan_t2i_avg", "method", "mean", "model.method must be one of attention, summax; got the string 'mean'"),
    ("scan_t2i_avg", "raw_feature_norm", "l3", "model.raw_feature_norm must be one of softmax, l2norm, "
                                               "clipped_l2norm, l1norm, clipped_l1norm, clipped, no_norm; got the string 'l3'"),
    ("scan_t2i_avg", "agg", "median", "model.agg must be one of avg, lse, sum, max; got the string 'median'"),
    ("scan_t2i_avg", "gemm_dtype", "int8", "model.gemm_dtype must be one of float32, bfloat16, float16; got the "
                                           "string 'int8'"),
    ("scan_t2i_avg", "feature_norm", "zscore", "model.feature_norm must be one of none, l2, batchnorm; got the string "
                                               "'zscore'"),
    ("caan", "intra", "both", "model.intra must be one of none, feature, semantic; got the string 'both'"),
    ("vsepp", "text_pool", "max", "model.text_pool must be one of last, mean; got the string 'max'"),
    ("sman", "score_mode", "max", "model.score_mode must be one of concat, sum; got the string 'max'"),
    ("sman", "word_init", "zeros", "model.word_init must be one of uniform, xavier; got the string 'zeros'"),
    ("sman", "grid_pool", 0, "model.grid_pool must be >= 1, got 0"),
    ("sman", "alpha", 1.5, "model.alpha must be >= 0 and <= 1.0, got 1.5"),
    ("mmca", "alpha", -0.5, "model.alpha must be >= 0, got -0.5"),
    ("mtfn", "rank", 0, "model.rank must be >= 1, got 0"),
    ("mtfn", "fusion_dim", 0, "model.fusion_dim must be >= 1 and <= 16777216, got 0"),
]


@pytest.mark.parametrize("name, key, value, line", REFUSED)
def test_a_bad_option_is_refused_in_one_line_before_any_model_is_built(monkeypatch, name, key, value, line):
    cls = registry.model_class(name)
    monkeypatch.setattr(cls, "__init__", lambda *a, **k: pytest.fail("a model was built"))
    with pytest.raises(ConfigError) as e:
        create_model(name, **{key: value})
    assert str(e.value) == line
    with pytest.raises(ConfigError) as e:
        load_config(None, [f"model.name={name}", f"model.{key}={value}"])
    assert str(e.value) == line


def test_a_bad_option_is_one_error_line_on_the_command_line(capsys):
    assert main(["train", "--config", "quickstart_scan", "--set", "model.agg=median"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vlmatch: error: ") and err.count("\n") == 1
    assert err.endswith("quickstart_scan.yaml: model.agg must be one of avg, lse, sum, max; got the string 'median'\n")


def test_a_recipe_section_is_read_by_the_runner_and_ignored_by_training(tmp_path):
    # experiments/recipes/*.yaml are config files with a `recipe:` section: `vlmatch train --config` trains them as
    # they are; any other unknown section is still refused, naming the file
    f = tmp_path / "r.yaml"
    f.write_text("recipe: {name: r, data: toyworld}\nmodel: {name: vsepp}\ntrain: {epochs: 3, seed: 7}\n")
    cfg = load_config(str(f))
    assert "recipe" not in cfg and cfg["train"]["epochs"] == 3 and cfg["train"]["seed"] == 7
    f.write_text("recipes: {name: r}\nmodel: {name: vsepp}\n")
    with pytest.raises(Exception, match=r"r\.yaml.*unknown section\(s\) \['recipes'\]"):
        load_config(str(f))


def test_a_shipped_config_names_its_features_under_the_cache_root(monkeypatch, tmp_path):
    from vlmatch.training.config import load_config

    monkeypatch.setenv("VLMATCH_CACHE", str(tmp_path))
    cfg = load_config("vsepp_minilm_f8k", overrides=["train.init_from=$VLMATCH_CACHE/runs/a/best"])
    assert cfg["data"]["path"] == f"{tmp_path}/flickr8k-efficientnet-lite0"
    assert cfg["train"]["init_from"] == f"{tmp_path}/runs/a/best"
    assert load_config("vsepp_minilm_f8k", overrides=["data.path=toyworld"])["data"]["path"] == "toyworld"


def test_a_path_naming_an_unset_variable_is_one_problem_naming_it(monkeypatch):
    from vlmatch.errors import ConfigError
    from vlmatch.training.config import load_config

    monkeypatch.delenv("VLMATCH_DATA", raising=False)
    with pytest.raises(ConfigError, match=r"data.entities .*\$VLMATCH_DATA is not set"):
        load_config("vsepp_minilm_f8k", overrides=["data.entities=$VLMATCH_DATA/flickr30k_entities"])
