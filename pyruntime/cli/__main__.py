"""``python -m pyruntime.cli``."""

import sys

from . import main

sys.exit(main())
