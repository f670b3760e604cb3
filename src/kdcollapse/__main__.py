"""``python -m kdcollapse`` (and ``torchrun -m kdcollapse``): the ``kdcollapse`` command.

``python -m`` puts the current directory first on ``sys.path``, so a ``yaml.py`` or ``mymodels.py`` lying
beside a shared run directory would be imported in place of the real module: it is taken off again before
anything else is imported. ``--import MODULE`` still finds modules there (the user names them)."""

import os
import sys

if sys.path and sys.path[0] in ("", os.getcwd()):
    del sys.path[0]

from kdcollapse.cli import main  # noqa: E402

raise SystemExit(main())
