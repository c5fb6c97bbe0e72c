"""`python -m specpilot.cli`: the same as the `specpilot` command."""

import sys

from specpilot.cli import main

sys.exit(main())
