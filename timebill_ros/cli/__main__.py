"""``python -m timebill_ros.cli``: the ``timebill`` command."""

import sys

from timebill_ros.cli import main

sys.exit(main())
