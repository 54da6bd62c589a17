"""Who may read and prove the audit trail (audit.list is a read like every list)."""

from compute.core.api.grants import grant

grant("viewer", "audit.verify", "audit.prove", "audit.checkpoints")
