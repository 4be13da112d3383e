"""``python -m turnfsm``."""

import sys

from turnfsm.cli import main

sys.exit(main())
