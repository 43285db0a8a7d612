"""``msprobe-launch``: run a training script exactly as torchrun (or msrun) would, with every rank dumping.

The command line (``surface``) becomes a request, the request a plan (``plan``: validated, nothing started),
the plan a job (``engines``: torchrun's agent or msrun in this process, or a command as a child, then the
dump summary). The workers learn about the dump only through the MSPROBE_* variables (msprobe_inject.envvars).
"""

from __future__ import annotations

import json
from typing import List, Optional

from msprobe_launch import engines, surface
from msprobe_launch.plan import Request, build_plan


def run(request: Request) -> int:
    """Plan the request and run it, or print the plan with --dry-run. Raises plan.LaunchError (exit 2)."""
    plan = build_plan(request)
    if request.dry_run:
        print(json.dumps(plan.to_json(), indent=1))
        return 0
    return engines.execute(plan)


def main(argv: Optional[List[str]] = None) -> None:
    surface.main(argv, run)


if __name__ == "__main__":
    main()
