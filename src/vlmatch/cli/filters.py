"""``vlmatch search``'s filters (``--after``, ``--before``, ``--camera``, ``--under``, ``--near``): flags
-> :class:`vlmatch.search.filters.Where`."""

from __future__ import annotations


def add_filter_args(p) -> None:
    g = p.add_argument_group("filters (applied in stage 1: the results are the best matching photos)")
    g.add_argument("--after", metavar="DATE", help="taken on or after DATE (YYYY-MM-DD or ISO 8601 time); photos "
                                                  "without a capture time are left out")
    g.add_argument("--before", metavar="DATE", help="taken on or before DATE (a whole day with YYYY-MM-DD)")
    g.add_argument("--camera", metavar="TEXT", help="camera make and model contain TEXT (any case)")
    g.add_argument("--under", metavar="SUBFOLDER", help="in SUBFOLDER of the indexed photo folder (any depth)")
    g.add_argument("--near", metavar="LAT,LON,KM", help="GPS position within KM kilometres of LAT,LON; south and "
                                                        "west are negative, as given: --near -33.87,151.21,10")


def where_of(a):
    """The Where of the parsed flags (None: no filter); a bad value is a ConfigError naming the flag."""
    from ..errors import ConfigError
    from ..search.filters import Where

    try:
        return Where.of({k: getattr(a, k) for k in ("after", "before", "camera", "under", "near")})
    except ConfigError as e:
        raise ConfigError(f"--{e}") from None
