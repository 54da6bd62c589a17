"""The work queue: items keyed by (kind, key) in 256 shards; workers hold shard leases.

An item names a thing to reconcile (a reservation, a node), not what to do to it: the
handler reads desired and observed state and takes one step, so running it again is
harmless and a lost message is repaired by the next pass. Only the worker holding an item's
shard lease processes it, so one item is never processed by two workers at once; a worker
that dies loses its leases when they expire and another takes its shards over.
"""
