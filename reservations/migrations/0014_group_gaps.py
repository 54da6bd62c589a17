# Free time of whole GPU groups (a node's GPUs, or one NVLink domain's), derived from the
# bookings by Postgres itself (see reservations.gaps). Every statement that writes bookings
# ends in a trigger that marks the time it changed in each group stale, in the booker's own
# transaction; a GPU that moves between groups marks both whole. Menders (the workers) then
# recompute the marked spans from the bookings, one per node at a time on an advisory lock
# that bookers never take; in READ COMMITTED each statement after it sees what the lock's
# previous holders committed.
from django.db import migrations, models

GAPS_SQL = """
CREATE INDEX reservations_groupgap_touching ON reservations_groupgap
  USING gist (node_id, domain, tstzrange(lo, hi, '[]'));
CREATE INDEX reservations_groupgap_shape ON reservations_groupgap
  USING gist (pool_id, point(end_s, length_s));
CREATE INDEX reservations_groupgap_tails ON reservations_groupgap (pool_id, node_id, domain)
  WHERE hi = 'infinity';

-- Recompute the gaps of these nodes' groups over what their stale marks say changed (and
-- the gaps that touch it; over all of time for a group that has no gaps: it was never
-- booked), then drop those marks. A group left free all along keeps no row. Only this
-- function rewrites gaps, one caller per node at a time: it waits for the node's lock and
-- holds nothing else of the ledger's, while bookers never take that lock. How many marks
-- it mended.
CREATE FUNCTION reservations_groupgap_mend(nodes varchar[]) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
  mended integer;
BEGIN
  PERFORM pg_advisory_xact_lock(hashtextextended('groupgap:' || node, 0))
     FROM (SELECT DISTINCT node FROM unnest(nodes) node ORDER BY node) locked;
  -- A statement of its own: it sees what the lock's previous holders committed.
  WITH seen AS (
    DELETE FROM reservations_stalegaps WHERE node_id = ANY(nodes)
    RETURNING node_id, domain, tstzrange(lo, hi) AS span),
  changed AS (
    SELECT seen.node_id AS node, seen.domain, range_merge(range_agg(seen.span)) AS span,
           count(*) AS marks
      FROM seen GROUP BY seen.node_id, seen.domain),
  region AS (
    SELECT c.node, c.domain, c.marks,
           CASE WHEN EXISTS (SELECT 1 FROM reservations_groupgap g
                              WHERE g.node_id = c.node AND g.domain = c.domain)
                THEN tstzrange(least(lower(c.span), t.lo), greatest(upper(c.span), t.hi))
                ELSE tstzrange('-infinity', 'infinity') END AS w
      FROM changed c CROSS JOIN LATERAL (
        SELECT min(g.lo) AS lo, max(g.hi) AS hi FROM reservations_groupgap g
         WHERE g.node_id = c.node AND g.domain = c.domain
           AND tstzrange(g.lo, g.hi, '[]') && tstzrange(lower(c.span), upper(c.span), '[]')) t),
  gone AS (
    DELETE FROM reservations_groupgap g USING region r
     WHERE g.node_id = r.node AND g.domain = r.domain
       AND (tstzrange(g.lo, g.hi, '[]') && tstzrange(lower(r.w), upper(r.w), '()')
            OR g.hi < now() - interval '1 day')),
  held AS (
    SELECT r.node, r.domain, r.w, n.pool_id, range_agg(b.during) AS busy
      FROM region r JOIN fleet_node n ON n.id = r.node
      LEFT JOIN fleet_device d ON d.node_id = r.node AND d.parent_id IS NULL
            AND d.device_class = 'gpu' AND (r.domain = '' OR d.nvlink_domain = r.domain)
      LEFT JOIN reservations_booking b ON b.gpu_id = d.id AND b.during && r.w
     GROUP BY r.node, r.domain, r.w, n.pool_id),
  written AS (
    INSERT INTO reservations_groupgap (pool_id, node_id, domain, lo, hi, end_s, length_s)
    SELECT held.pool_id, held.node, held.domain, lower(f), upper(f),
           least(extract(epoch FROM upper(f))::float8, 1e15),
           least(extract(epoch FROM upper(f))::float8 - extract(epoch FROM lower(f))::float8,
                 1e15)
      FROM held, unnest(tstzmultirange(held.w) - coalesce(held.busy, '{}')) f
     WHERE upper(f) >= now() - interval '1 day'
       AND f <> tstzrange('-infinity', 'infinity'))
  SELECT coalesce(sum(marks), 0) INTO mended FROM region;
  RETURN mended;
END $$;

-- After every statement that writes bookings: the groups of their GPUs (the node, and the
-- GPU's NVLink domain), over both extents of every booking whose GPU or window changed.
CREATE FUNCTION reservations_booking_gaps() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  gpus varchar[];
  spans tstzrange[];
BEGIN
  IF TG_OP = 'INSERT' THEN
    SELECT array_agg(gpu_id), array_agg(during) INTO gpus, spans FROM booked_now;
  ELSIF TG_OP = 'DELETE' THEN
    SELECT array_agg(gpu_id), array_agg(during) INTO gpus, spans FROM booked_before;
  ELSE
    SELECT array_agg(side.gpu_id), array_agg(side.during) INTO gpus, spans
      FROM booked_before o JOIN booked_now n ON n.id = o.id
     CROSS JOIN LATERAL (VALUES (o.gpu_id, o.during), (n.gpu_id, n.during))
           side(gpu_id, during)
     WHERE (o.gpu_id, o.during) IS DISTINCT FROM (n.gpu_id, n.during);
  END IF;
  INSERT INTO reservations_stalegaps (node_id, domain, lo, hi)
  SELECT DISTINCT d.node_id, grp.domain, lower(c.span), upper(c.span)
    FROM unnest(gpus, spans) c(gpu, span) JOIN fleet_device d ON d.id = c.gpu
   CROSS JOIN LATERAL (VALUES (''), (d.nvlink_domain)) grp(domain)
   WHERE (grp.domain = '' OR d.nvlink_domain <> '') AND NOT isempty(c.span);
  RETURN NULL;
END $$;
CREATE TRIGGER reservations_booking_gaps_insert AFTER INSERT ON reservations_booking
  REFERENCING NEW TABLE AS booked_now
  FOR EACH STATEMENT EXECUTE FUNCTION reservations_booking_gaps();
CREATE TRIGGER reservations_booking_gaps_update AFTER UPDATE ON reservations_booking
  REFERENCING OLD TABLE AS booked_before NEW TABLE AS booked_now
  FOR EACH STATEMENT EXECUTE FUNCTION reservations_booking_gaps();
CREATE TRIGGER reservations_booking_gaps_delete AFTER DELETE ON reservations_booking
  REFERENCING OLD TABLE AS booked_before
  FOR EACH STATEMENT EXECUTE FUNCTION reservations_booking_gaps();

-- A GPU that moves to another node or NVLink domain (or stops being a whole GPU) takes its
-- bookings from one group to another: both are rebuilt. A GPU that appears or goes has no
-- bookings (they protect it), so it changes no group's free time.
CREATE FUNCTION reservations_device_gaps() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO reservations_stalegaps (node_id, domain, lo, hi)
  SELECT DISTINCT grp.node, grp.domain, '-infinity'::timestamptz, 'infinity'::timestamptz
    FROM (VALUES (OLD.node_id, ''), (OLD.node_id, OLD.nvlink_domain), (NEW.node_id, ''),
                 (NEW.node_id, NEW.nvlink_domain)) grp(node, domain);
  RETURN NULL;
END $$;
CREATE TRIGGER reservations_device_gaps AFTER UPDATE ON fleet_device FOR EACH ROW
  WHEN ((OLD.node_id, OLD.nvlink_domain, OLD.parent_id, OLD.device_class)
        IS DISTINCT FROM (NEW.node_id, NEW.nvlink_domain, NEW.parent_id, NEW.device_class))
  EXECUTE FUNCTION reservations_device_gaps();

-- The gaps of every group booked so far.
INSERT INTO reservations_stalegaps (node_id, domain, lo, hi)
SELECT DISTINCT d.node_id, grp.domain, '-infinity'::timestamptz, 'infinity'::timestamptz
  FROM reservations_booking b JOIN fleet_device d ON d.id = b.gpu_id
 CROSS JOIN LATERAL (VALUES (''), (d.nvlink_domain)) grp(domain)
 WHERE grp.domain = '' OR d.nvlink_domain <> '';
SELECT reservations_groupgap_mend(array_agg(DISTINCT node_id)) FROM reservations_stalegaps
HAVING count(*) > 0;
"""

DROP_GAPS_SQL = """
DROP TRIGGER reservations_device_gaps ON fleet_device;
DROP FUNCTION reservations_device_gaps();
DROP TRIGGER reservations_booking_gaps_insert ON reservations_booking;
DROP TRIGGER reservations_booking_gaps_update ON reservations_booking;
DROP TRIGGER reservations_booking_gaps_delete ON reservations_booking;
DROP FUNCTION reservations_booking_gaps();
DROP FUNCTION reservations_groupgap_mend(varchar[]);
"""


class Migration(migrations.Migration):
    dependencies = [("fleet", "0016_bare_metal_deploy"),
                    ("reservations", "0013_reservation_idle_since")]

    operations = [
        migrations.CreateModel(
            name="GroupGap",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True,
                                           serialize=False, verbose_name="ID")),
                ("pool_id", models.CharField(max_length=32)),
                ("node_id", models.CharField(max_length=32)),
                ("domain", models.CharField(blank=True, help_text="The NVLink domain; empty "
                                            "for the whole node.", max_length=32)),
                ("lo", models.DateTimeField(help_text="Free from (may be -infinity).")),
                ("hi", models.DateTimeField(help_text="Free until (infinity for a node's "
                                            "last booking).")),
                ("end_s", models.FloatField()),
                ("length_s", models.FloatField()),
            ],
        ),
        migrations.CreateModel(
            name="StaleGaps",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True,
                                           serialize=False, verbose_name="ID")),
                ("node_id", models.CharField(db_index=True, max_length=32)),
                ("domain", models.CharField(blank=True, max_length=32)),
                ("lo", models.DateTimeField()),
                ("hi", models.DateTimeField()),
            ],
        ),
        migrations.RunSQL(GAPS_SQL, DROP_GAPS_SQL),
    ]
