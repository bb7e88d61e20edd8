"""``python -m tablefree.cli`` (how torchrun launches a verb): the same as the ``tablefree`` command."""

import sys

from tablefree.cli import main

sys.exit(main())
