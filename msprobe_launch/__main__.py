"""``python -m msprobe_launch`` is ``msprobe-launch``."""

from msprobe_launch.cli import main

main()
