"""Kept for one release: :mod:`vlmatch.scoring` is now :mod:`vlmatch.evaluation.scoring` (import it from there).

This name is the very same module object, so every function and setting is shared."""

import sys

from .evaluation import scoring as _moved

sys.modules[__name__] = _moved
