"""Kept for one release: :mod:`vlmatch.scoring` is now :mod:`vlmatch.evaluation.scoring` (import it from there)."""

import sys

from .evaluation import scoring as _moved

sys.modules[__name__] = _moved
