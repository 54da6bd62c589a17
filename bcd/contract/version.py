"""The one version every program prints (`better-compute`, `bcd`, the gateway), and which
agents a control plane takes: its own minor release and the one before (a fleet is
upgraded control plane first, agents after, one machine at a time)."""

from __future__ import annotations

import re

VERSION = "0.2.0"

# The session protocol's revision, sent in Hello. 1: Hello carries the agent's version and
# this revision. Agents before it (0.1) send neither: agent_version "bcd-py", protocol 0.
PROTOCOL = 1
UNVERSIONED_AGENT = ("bcd-py", "0.1.0")  # what 0.1 agents say, and the release they are


def version() -> str:
    """This release's version: a constant here, so that printing it loads no package
    metadata (pyproject.toml reads it from here too)."""
    return VERSION


def release(text: str) -> tuple[int, int] | None:
    """(major, minor) of a version such as 0.2.0, 0.2.1rc1 or 1.4; None when it is none."""
    found = re.fullmatch(r"(\d+)\.(\d+)(?:[.+\-a-z].*)?", text.strip())
    return (int(found[1]), int(found[2])) if found else None


def agent_refusal(agent_version: str, *, current: str) -> str:
    """Why a control plane of version `current` refuses an agent of `agent_version` ("" when
    it takes it): an agent of its own minor release or the previous one is taken."""
    if agent_version == UNVERSIONED_AGENT[0]:
        agent_version = UNVERSIONED_AGENT[1]
    ours, theirs = release(current), release(agent_version)
    if ours is None:  # a control plane run from a source tree without its metadata
        return ""
    if theirs is None:
        return (f"agent version {agent_version[:40]!r} is not a release this control plane "
                f"({current}) can check; install bcd {ours[0]}.{ours[1]}")
    oldest = (ours[0], ours[1] - 1) if ours[1] else ours
    if theirs < oldest:
        return (f"agent {agent_version} is older than this control plane ({current}) takes "
                f"(bcd {oldest[0]}.{oldest[1]} or {ours[0]}.{ours[1]}); upgrade bcd")
    if theirs > ours:
        return (f"agent {agent_version} is newer than this control plane ({current}); "
                "upgrade the control plane first")
    return ""
