"""``python -m jaxmodel.cli ...``: the ``jaxmodel`` command."""

import sys

from jaxmodel.cli import main

sys.exit(main())
