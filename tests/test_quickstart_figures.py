"""The quickstart's figures in README.md and docs/getting-started.md are those of the recorded run
(experiments/results/toyworld.json), and the spread they name across hosts is that of the hosts recorded
in experiments/results/quickstart_hosts.json: a user whose run differs by two points sees that it did not
break."""

import json
import re
from pathlib import Path

import pytest

from vlmatch.evaluation.metrics import format_table

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results"
PAGES = [ROOT / "README.md", ROOT / "docs" / "getting-started.md"]
NUM = r"(\d+(?:\.\d+)?)"
SPREAD = re.compile(rf"Over the \[?(\d+) hosts[^\]]*\]\([^)]*quickstart_hosts\.(?:json|md)\), VSE\+\+ gave rsum {NUM} to "
                    rf"{NUM} and SCAN {NUM} to {NUM}", re.I)


def recorded() -> dict:
    return json.loads((RESULTS / "toyworld.json").read_text())["results"]


def _rows(text: str) -> list[str]:
    return [line.rstrip() for line in text.splitlines() if line.startswith(("vsepp ", "scan_t2i_avg "))]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_the_quickstart_table_is_the_recorded_runs(page):
    want = _rows(format_table({k: recorded()[k] for k in ("vsepp", "scan_t2i_avg")}))
    assert _rows(page.read_text()) == want, f"{page.name}: rerun `python experiments/toyworld.py` or copy its table"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_the_spread_across_hosts_is_the_recorded_hosts(page):
    hosts = json.loads((RESULTS / "quickstart_hosts.json").read_text())["hosts"]
    m = SPREAD.search(re.sub(r"\s+", " ", page.read_text()))
    assert m, f"{page.name} does not say how far the quickstart's figures move across hosts"
    vsepp = [h["rsum"]["vsepp"] for h in hosts]
    scan = [h["rsum"]["scan_t2i_avg"] for h in hosts]
    assert [float(x) for x in m.groups()] == [len(hosts), min(vsepp), max(vsepp), min(scan), max(scan)]
    assert hosts[0]["rsum"] == {k: round(recorded()[k]["rsum"], 1) for k in ("vsepp", "scan_t2i_avg")}


def test_the_other_toy_world_figures_on_getting_started_are_recorded():
    text = (ROOT / "docs" / "getting-started.md").read_text()
    for name, label in (("scan_i2t_avg", "SCAN i-t"), ("caan", "CAAN")):
        assert f"{label} ({recorded()[name]['rsum']:.1f})" in text


def test_every_results_file_the_host_record_cites_exists():
    """A host row names the results file it copies and the command that made it: both must be there."""
    cited = [path for h in json.loads((RESULTS / "quickstart_hosts.json").read_text())["hosts"]
             for path in re.findall(r"\b(?:experiments|benchmarks)/[\w/.-]+\.(?:json|py|md)", h["host"] + " " + h["source"])]
    assert cited, "quickstart_hosts.json cites no results file or command: its first row is a recorded run's"
    for path in cited:
        assert (ROOT / path).is_file(), f"quickstart_hosts.json cites {path}, which does not exist"
