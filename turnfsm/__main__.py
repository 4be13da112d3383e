"""``python -m turnfsm``."""

from turnfsm.cli import script

script()
