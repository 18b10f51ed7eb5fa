"""``python -m vlmatch.cli`` (e.g. under torchrun)."""

import sys

from . import main

sys.exit(main())
