"""``python -m nnfuse``: the nnfuse command-line tool (the same code as the ``nnfuse`` binary)."""
from __future__ import annotations

import sys
from typing import List, Optional


def main(argv: Optional[List[str]] = None) -> int:
    """Runs the CLI on ``argv`` (default: ``sys.argv[1:]``) and returns its exit code."""
    from . import _core

    args = list(sys.argv[1:] if argv is None else argv)
    sys.stdout.flush()
    sys.stderr.flush()
    return _core.cli_main(["nnfuse", *args])


def console_main() -> None:
    """Entry point of the ``nnfuse`` console script that ``pip install`` creates."""
    sys.exit(main())


if __name__ == "__main__":
    sys.exit(main())
