"""``python -m fleetops.cli``: the ``fleetops`` command."""

import sys

from fleetops.cli import main

sys.exit(main())
