"""Entry point for an ``msprobe-dump DUMP_PATH`` console script (the summary table of a dump directory)."""

import sys
from typing import List, Optional

from msprobe_launch.summary import main as _summary_main


def main(argv: Optional[List[str]] = None) -> None:
    sys.exit(_summary_main(argv))


if __name__ == "__main__":
    main()
