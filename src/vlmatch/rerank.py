"""Kept for one release: :mod:`vlmatch.rerank` is now :mod:`vlmatch.evaluation.rerank` (import it from there).

This name is the very same module object, so every function and setting is shared."""

import sys

from .evaluation import rerank as _moved

sys.modules[__name__] = _moved
