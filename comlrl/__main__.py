"""``python -m comlrl`` is the ``comlrl`` command."""

import sys

from .cli import main

sys.exit(main())
