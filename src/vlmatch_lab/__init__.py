"""The helpers shared by the rooms beside the package (experiments/, benchmarks/, release/): where their data and
their one cache are (:mod:`~vlmatch_lab.paths`), the host a figure was measured on (:mod:`~vlmatch_lab.host`), the
checks of what a script reads before its first expensive step (:mod:`~vlmatch_lab.inputs`), the Flickr8k feature
caches and run folders (:mod:`~vlmatch_lab.caches`), the recipes of recorded runs (:mod:`~vlmatch_lab.recipes`)
and a Milvus server process for the tests and the Milvus benchmark (:mod:`~vlmatch_lab.milvus_server`).

The rooms import vlmatch and this package, never each other. It is not part of the vlmatch library: vlmatch never
imports it (the import-linter contracts in pyproject.toml), and the wheel leaves it out (tests/test_wheel.py).
"""
