"""A node profile: software units the agent keeps on its machine, named by the pool's policy
and carried in the node's desired state (`profile` of a NodeSpec); the agent reports each
unit's state with the spec generation it converged for."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

CONTAINER_TOOLKIT = "container-toolkit"
SLURMD = "slurmd"
PROFILE_UNITS = (CONTAINER_TOOLKIT, SLURMD)
# ready: converged; unavailable: what it needs is not on the machine (the reason says
# what); failed: it was tried and did not work (the reason has the tool's words).
UNIT_STATES = ("ready", "unavailable", "failed")


class BadProfile(ValueError):
    """A spec's profile that is not a list of known units."""


def units_of(spec: dict[str, Any]) -> tuple[str, ...]:
    """The units a NodeSpec's profile names (none when it has no profile)."""
    profile = spec.get("profile") or {}
    units = profile.get("units", []) if isinstance(profile, dict) else None
    if not isinstance(units, list) or not all(u in PROFILE_UNITS for u in units) \
            or len(set(units)) != len(units):
        raise BadProfile(f"profile.units must name units among {', '.join(PROFILE_UNITS)}, "
                         "once each")
    return tuple(units)


@dataclass(frozen=True)
class UnitState:
    state: str
    reason: str = ""
    generation: int = 0  # the spec generation it converged for
    at: str = ""  # when it last changed (ISO 8601)

    def wire(self) -> dict[str, Any]:
        return {"state": self.state, "reason": self.reason, "generation": self.generation,
                "at": self.at}
