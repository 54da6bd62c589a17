"""Where a join token may come from: BCD_JOIN_TOKEN, standard input, or a private file.

Never from the command line, where other users could read it in the process list.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

from bcd.config import VARIABLES


class TokenError(Exception):
    pass


def read_token_file(path: Path) -> str:
    """A regular file its owner alone can read (0600 or 0400), owned by us."""
    try:
        info = path.lstat()
    except FileNotFoundError:
        raise TokenError(f"{path}: no such file") from None
    if not stat.S_ISREG(info.st_mode):
        raise TokenError(f"{path} is not a regular file")
    if info.st_mode & 0o077:
        raise TokenError(f"{path} is readable by others (mode {stat.S_IMODE(info.st_mode):04o});"
                         " chmod 600 it")
    if info.st_uid != os.geteuid():
        raise TokenError(f"{path} belongs to another user")
    return path.read_text().strip()


def read_token(token_file: Path | None) -> str:
    if token_file is not None:
        token = read_token_file(token_file)
    elif VARIABLES.is_set("BCD_JOIN_TOKEN"):
        token = VARIABLES.text("BCD_JOIN_TOKEN")
    elif not sys.stdin.isatty():
        token = sys.stdin.read().strip()
    else:
        raise TokenError("no join token: set BCD_JOIN_TOKEN, pipe it on standard input or give "
                         "--token-file (never an argument)")
    if not token.startswith("bcjt_"):
        raise TokenError("that is not a join token (bcjt_…)")
    return token
