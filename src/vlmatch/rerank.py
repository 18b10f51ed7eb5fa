"""Kept for one release: :mod:`vlmatch.rerank` is now :mod:`vlmatch.evaluation.rerank` (import it from there)."""

import sys

from .evaluation import rerank as _moved

sys.modules[__name__] = _moved
