"""The reservation state machine: every transition goes through `transition`."""

from __future__ import annotations

from compute.core.errors import InvalidState
from reservations.models import Reservation, ReservationState

S = ReservationState
TRANSITIONS: dict[str, set[str]] = {
    S.PENDING: {S.PLACED, S.CANCELLED, S.FAILED},
    S.PLACED: {S.BINDING, S.RELEASED, S.CANCELLED, S.PENDING, S.FAILED},
    S.BINDING: {S.ACTIVE, S.PLACED, S.PENDING, S.RELEASED, S.CANCELLED, S.FAILED},
    S.ACTIVE: {S.RELEASED},
    S.RELEASED: set(),
    S.CANCELLED: set(),
    S.FAILED: set(),
}
TERMINAL = frozenset(state for state, targets in TRANSITIONS.items() if not targets)
HOLDING = frozenset({S.PLACED, S.BINDING, S.ACTIVE})


def transition(reservation: Reservation, to: str) -> None:
    """Move `reservation` to `to` in memory; the caller saves it in its transaction."""
    if to not in TRANSITIONS[reservation.state]:
        raise InvalidState(f"reservation {reservation.id} is {reservation.state}; it cannot "
                           f"become {to}", state=reservation.state, to=to)
    reservation.state = to
