"""Models of the compute app, defined in their own modules."""

from compute.events.models import Event, EventHead
from compute.iam.refusals import RefusalBudget
from compute.iam.streams import StreamLease
from compute.idempotency import IdempotencyRecord
from compute.queue.models import ShardLease, WorkerPresence, WorkItem
from compute.tenancy.models import ApiToken, Principal, RoleBinding, Tenant

__all__ = ["ApiToken", "Event", "EventHead", "IdempotencyRecord", "Principal", "RefusalBudget",
           "RoleBinding", "ShardLease", "StreamLease", "Tenant", "WorkItem", "WorkerPresence"]
