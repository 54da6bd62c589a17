"""A node's host claims are refereed by Postgres at every commit, whatever wrote them.

`bc_node_claims(node)` is what a node's claims add up to: its live sandboxes, plus the most
its live GPU allocations hold at one moment of their windows. A deferred constraint trigger
on every row that can raise a claim (an allocation, a booking of one, a sandbox, the node's
size) runs at commit: it locks the node's row, then, in a statement that sees every commit
before that lock, writes the claims where the row raised them into the node's counters,
where the node's CHECK constraints refuse a node whose claims exceed its size. Two
transactions that claim one node take turns on its row, and the second counts the first.
The row is always written, so that under REPEATABLE READ the second fails to serialize.
"""

from django.db import migrations

CLAIMS = """
-- What a node's claims add up to within `span`: its live sandboxes, plus the most its live
-- GPU allocations that meet the span hold at one moment of it (found through the devices'
-- booking index, so it costs what meets the span, not the node's whole calendar).
CREATE FUNCTION bc_node_claims_within(node text, span tstzrange, OUT vcpus bigint,
                                      OUT memory bigint)
LANGUAGE sql STABLE AS $$
WITH meeting AS MATERIALIZED (
  SELECT DISTINCT b.allocation_id FROM fleet_device d
    JOIN reservations_booking b ON b.device_id = d.id AND b.during && span
   WHERE d.node_id = node),
spans AS (
  SELECT a.vcpus, a.memory_gib, greatest(min(lower(b.during)), lower(span)) AS lo,
         least(max(upper(b.during)), upper(span)) AS hi
    FROM meeting m JOIN reservations_allocation a ON a.id = m.allocation_id
    JOIN reservations_booking b ON b.allocation_id = a.id
   WHERE a.ended_at IS NULL
   GROUP BY a.id),
edges AS (
  SELECT lo AS at, 1 AS starts, vcpus AS dv, memory_gib AS dm FROM spans
  UNION ALL
  SELECT hi, 0, -vcpus, -memory_gib FROM spans),
peak AS (
  SELECT coalesce(max(v), 0) AS vcpus, coalesce(max(m), 0) AS memory FROM (
    SELECT sum(dv) OVER w AS v, sum(dm) OVER w AS m FROM edges
    WINDOW w AS (ORDER BY at, starts)) running),
sandboxes AS (
  SELECT coalesce(sum(s.vcpus), 0) AS vcpus, coalesce(sum(s.memory_gib), 0) AS memory
    FROM reservations_sandbox s WHERE s.node_id = node AND s.ended_at IS NULL)
SELECT sandboxes.vcpus + peak.vcpus, sandboxes.memory + peak.memory FROM sandboxes, peak
$$;

-- What a node's claims add up to over its whole calendar.
CREATE FUNCTION bc_node_claims(node text, OUT vcpus bigint, OUT memory bigint)
LANGUAGE sql STABLE AS $$
SELECT vcpus, memory FROM bc_node_claims_within(node, tstzrange(NULL, NULL))
$$;

-- At commit, for a row that may have raised a node's claims: lock the node (claimers of a
-- node take turns), then, in statements that see every commit before that lock, write the
-- claims into its counters, where its CHECK constraints referee. A GPU allocation raises
-- them only within its own window, so that window is recounted (the counters become the
-- larger of what they were and what it holds); a sandbox or a new size, open-ended, makes
-- the whole calendar recounted. A booking whose allocation's window was checked already in
-- this transaction is not checked twice. Rows that only lower claims (an allocation or a
-- sandbox that ended) are not refereed: the services recount those.
CREATE FUNCTION bc_node_claims_refereed() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  node text;
  allocation text;
  span tstzrange;
  seen text;
  claims record;
BEGIN
  IF TG_TABLE_NAME IN ('reservations_booking', 'reservations_allocation') THEN
    IF TG_TABLE_NAME = 'reservations_booking' THEN
      allocation := NEW.allocation_id;
    ELSE
      allocation := NEW.id;
    END IF;
    SELECT a.node_id, tstzrange(min(lower(b.during)), max(upper(b.during)), '[)')
      INTO node, span
      FROM reservations_allocation a JOIN reservations_booking b ON b.allocation_id = a.id
     WHERE a.id = allocation AND a.ended_at IS NULL GROUP BY a.node_id;
    IF node IS NULL THEN
      RETURN NULL;  -- ended, or no bookings: it claims nothing
    END IF;
    seen := allocation || span::text || ';';
    IF TG_TABLE_NAME = 'reservations_booking'
       AND strpos(coalesce(current_setting('bc.claims_checked', true), ''), seen) > 0 THEN
      RETURN NULL;
    END IF;
    PERFORM set_config('bc.claims_checked',
                       coalesce(current_setting('bc.claims_checked', true), '') || seen, true);
    PERFORM 1 FROM fleet_node WHERE id = node FOR UPDATE;
    SELECT * INTO claims FROM bc_node_claims_within(node, span);
    UPDATE fleet_node SET vcpus_allocated = greatest(vcpus_allocated, claims.vcpus),
                          memory_gib_allocated = greatest(memory_gib_allocated, claims.memory)
     WHERE id = node;
    RETURN NULL;
  END IF;
  IF TG_TABLE_NAME = 'fleet_node' THEN
    node := NEW.id;
  ELSE
    node := NEW.node_id;
  END IF;
  PERFORM 1 FROM fleet_node WHERE id = node FOR UPDATE;
  SELECT * INTO claims FROM bc_node_claims(node);
  UPDATE fleet_node SET vcpus_allocated = claims.vcpus, memory_gib_allocated = claims.memory
   WHERE id = node;
  RETURN NULL;
END $$;

CREATE CONSTRAINT TRIGGER bc_allocation_claims
  AFTER INSERT OR UPDATE OF node_id, vcpus, memory_gib, ended_at ON reservations_allocation
  DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.ended_at IS NULL)
  EXECUTE FUNCTION bc_node_claims_refereed();
CREATE CONSTRAINT TRIGGER bc_booking_claims
  AFTER INSERT OR UPDATE OF allocation_id, during ON reservations_booking
  DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.allocation_id IS NOT NULL)
  EXECUTE FUNCTION bc_node_claims_refereed();
CREATE CONSTRAINT TRIGGER bc_sandbox_claims
  AFTER INSERT OR UPDATE OF node_id, vcpus, memory_gib, ended_at ON reservations_sandbox
  DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.ended_at IS NULL)
  EXECUTE FUNCTION bc_node_claims_refereed();
CREATE CONSTRAINT TRIGGER bc_node_size_claims
  AFTER UPDATE OF vcpus, memory_gib ON fleet_node
  DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION bc_node_claims_refereed();
"""

DROP = """
DROP TRIGGER bc_node_size_claims ON fleet_node;
DROP TRIGGER bc_sandbox_claims ON reservations_sandbox;
DROP TRIGGER bc_booking_claims ON reservations_booking;
DROP TRIGGER bc_allocation_claims ON reservations_allocation;
DROP FUNCTION bc_node_claims_refereed();
DROP FUNCTION bc_node_claims_within(text, tstzrange);
DROP FUNCTION bc_node_claims(text);
"""


class Migration(migrations.Migration):

    dependencies = [
        ("reservations", "0014_group_gaps"),
        ("fleet", "0017_node_pool_order"),
    ]

    operations = [migrations.RunSQL(CLAIMS, DROP)]
