"""Who may read the events stream (events.list is a read like every list)."""

from compute.core.api.grants import grant

grant("viewer", "events.watch")
