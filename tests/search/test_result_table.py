"""The CLI's result table: capture time, camera and place columns when any hit records them, or a filter asks."""

from vlmatch.cli.search import format_results
from vlmatch.search.filters import Where
from vlmatch.search.hits import SearchHit


def test_camera_and_place_columns_show_when_any_hit_has_them():
    rows = [SearchHit(1, 0, 0.5, 0.25, path="/p/a.jpg", taken="2023-06-02T16:59:00", camera="Apple iPhone 14 Pro",
                      gps=[43.55123, 7.01234]),
            SearchHit(2, 1, 0.4, 0.2, path="/p/b.jpg")]
    lines = format_results(rows, "file").splitlines()
    assert lines[0].split() == ["rank", "score", "stage1", "taken", "camera", "place", "file"]
    assert lines[1] == "   1    0.5000    0.2500  2023-06-02 16:59  Apple iPhone 14 Pro  43.551,7.012         /p/a.jpg"
    assert lines[2].split()[3:] == ["-", "-", "-", "/p/b.jpg"]
    bare = [SearchHit(1, 0, 0.5, 0.25, path="/p/a.jpg")]
    assert format_results(bare, "file").splitlines()[0].split() == ["rank", "score", "stage1", "file"]
    # filtering on a camera or a place shows its column even when no hit records it (the answer is "-")
    head = format_results(bare, "file", Where(camera="pixel", near=(43.5, 7.0, 10))).splitlines()[0].split()
    assert head == ["rank", "score", "stage1", "camera", "place", "file"]
