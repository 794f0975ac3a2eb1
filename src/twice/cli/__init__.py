"""The `twice` command line: thin commands that parse, call one library function, print, return.

Commands live in modules by family and register on the one group in cli/group.py; what they print
is app/render.py's.
"""

from twice.cli import comparing, recording, runs, studies  # noqa: F401 (registers the commands)
from twice.cli.group import main

__all__ = ["main"]
