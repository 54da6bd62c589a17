"""Who may call webhooks.*: operators subscribe, replay and delete; every role reads."""

from compute.core.api.grants import grant

grant("viewer", "webhooks.deliveries")
grant("operator", "webhooks.*")
