"""Who may call the ledger's API methods (pools, offerings, reservations, capacity, ...)."""

from compute.core.api.grants import grant

grant("viewer", "capacity.*", "usage.*", "reservations.queue")
grant("member", "reservations.*", "series.*", "sandboxes.*")
grant("operator", "pools.*", "maintenance.*", "offerings.*")
