"""``python -m fleetops.rollout rollout driver ...`` / ``... apply power ...``."""

import sys

from fleetops.rollout.cli import main

sys.exit(main())
