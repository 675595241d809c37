"""The pinshim command of the Python distribution.

``pinshim [options] [--] COMMAND [ARGS...]``, ``python -m pinshim ...``,
``pinshim-report`` and ``pinshim-top`` run the programs the build installed
next to the library (the C command, which finds that library beside itself,
the report and top), so
the options, the environment they set, exit statuses and signals are those of
``pinshim(1)``. This launcher only replaces itself with them.
"""

import os
import sys
from typing import List, Optional, Sequence

from . import _private_file


def _exec(path: str, arguments: List[str]) -> int:
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execv(path, arguments)
    except OSError as error:
        print(f"pinshim: cannot run {path}: {error.strerror}", file=sys.stderr)
    return 126


# The subcommands that are Python scripts: their names as installed.
_SCRIPTS = {"report": "pinshim-report", "top": "pinshim-top"}


def _script_main(subcommand: str, argv: Optional[Sequence[str]]) -> int:
    """Runs a subcommand's script with this Python, so it works in an
    environment whose interpreter is not the python3 on PATH."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    try:
        script = _private_file(_SCRIPTS[subcommand])
    except FileNotFoundError as error:
        print(f"pinshim: {error}", file=sys.stderr)
        return 127
    if not sys.executable:  # embedded: the command runs python3 from PATH
        return main([subcommand, *arguments])
    return _exec(sys.executable, [sys.executable, script, *arguments])


def report_main(argv: Optional[Sequence[str]] = None) -> int:
    """``pinshim report ARGS`` and ``pinshim-report ARGS``: merges stats files
    and live records."""
    return _script_main("report", argv)


def top_main(argv: Optional[Sequence[str]] = None) -> int:
    """``pinshim top ARGS`` and ``pinshim-top ARGS``: the running processes'
    live records."""
    return _script_main("top", argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``pinshim ARGS``: replaces this process with the pinshim command."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] and arguments[0] in _SCRIPTS and sys.executable:
        return _script_main(arguments[0], arguments[1:])
    try:
        command = _private_file("pinshim")
    except FileNotFoundError as error:
        print(f"pinshim: {error}", file=sys.stderr)
        return 127
    return _exec(command, ["pinshim", *arguments])


if __name__ == "__main__":
    sys.exit(main())
