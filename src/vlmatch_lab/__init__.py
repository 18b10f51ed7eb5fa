"""Helpers shared by the rooms beside the package (experiments/, benchmarks/, release/): data and cache locations,
host records, input checks, feature caches, recipes, a Milvus test server. Not part of the library: vlmatch never
imports it (import-linter) and the wheel leaves it out.
"""
