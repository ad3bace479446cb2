"""``python -m jaxmodel ...``: the ``jaxmodel`` command (:func:`jaxmodel.cli.main`)."""

import sys

from jaxmodel.cli import main

sys.exit(main())
