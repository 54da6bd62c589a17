"""The `better-compute` command line: an HTTP client of the API envelope (no Django)."""

import sys

# Importing httpx imports its own command line (`httpx` the command: rich, pygments) unless
# that fails; this one never runs it, and a command starts on four fifths of the CPU without it.
sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]
