"""Models of the compute app, defined in their own modules."""

from compute.platform.events.models import Event, EventHead
from compute.platform.iam.refusals import RefusalBudget
from compute.platform.iam.streams import StreamLease
from compute.platform.iam.usage import IamUsage
from compute.platform.idempotency import IdempotencyRecord
from compute.platform.queue.models import ShardLease, WorkerPresence, WorkItem
from compute.platform.tenancy.models import (
    ApiToken,
    OidcIdentity,
    Principal,
    RoleBinding,
    Tenant,
)

__all__ = ["ApiToken", "Event", "EventHead", "IamUsage", "IdempotencyRecord", "OidcIdentity",
           "Principal", "RefusalBudget", "RoleBinding", "ShardLease", "StreamLease", "Tenant",
           "WorkItem", "WorkerPresence"]
