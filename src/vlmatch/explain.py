"""Kept for one release: :mod:`vlmatch.explain` is now :mod:`vlmatch.viz.attention` (import it from there).

This name is the very same module object, so every function and setting is shared."""

import sys

from .viz import attention as _moved

sys.modules[__name__] = _moved
