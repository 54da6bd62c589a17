# Free time of whole GPU groups (a node's GPUs, or one NVLink domain's), derived from the
# bookings by Postgres itself (see reservations.gaps). Every statement that writes bookings
# ends in a trigger that recomputes the gaps around the time it changed; a GPU that moves
# between groups has both groups rebuilt. Writers of one node's gaps take turns on an
# advisory lock they never wait for (a writer that finds it taken marks the node stale), and
# in READ COMMITTED each statement after it sees what the lock's holders committed.
from django.db import migrations, models

GAPS_SQL = """
CREATE INDEX reservations_groupgap_touching ON reservations_groupgap
  USING gist (node_id, domain, tstzrange(lo, hi, '[]'));
CREATE INDEX reservations_groupgap_shape ON reservations_groupgap
  USING gist (point(end_s, length_s));

-- Recompute the gaps of each group (nodes[i], domains[i]) over spans[i] and the gaps that
-- touch it; over all of time for a group that has none (it was never booked). A group left
-- free all along keeps no row. A node's gaps are rewritten by one transaction at a time,
-- the one holding its lock; a writer that cannot take the lock at once marks the node stale
-- instead of waiting (so no booker waits here, whatever locks it holds), and the next
-- holder that sees the mark rebuilds the node whole. Readers do not trust a stale node.
CREATE FUNCTION reservations_groupgap_refresh(nodes varchar[], domains varchar[],
                                              spans tstzrange[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
  mine varchar[];
  rebuilt varchar[];
BEGIN
  SELECT coalesce(array_agg(node ORDER BY node), '{}') INTO mine
    FROM (SELECT DISTINCT node FROM unnest(nodes) node) touched
   WHERE pg_try_advisory_xact_lock(hashtextextended('groupgap:' || node, 0));
  INSERT INTO reservations_stalegaps (node_id)
  SELECT DISTINCT node FROM unnest(nodes) node WHERE node <> ALL(mine);
  -- From here on each statement sees what the lock's previous holders committed.
  WITH seen AS (DELETE FROM reservations_stalegaps WHERE node_id = ANY(mine)
                RETURNING node_id)
  SELECT coalesce(array_agg(DISTINCT node_id), '{}') INTO rebuilt FROM seen;
  WITH changed AS (
    SELECT c.node, c.domain, range_merge(range_agg(c.span)) AS span FROM (
      SELECT * FROM unnest(nodes, domains, spans) c(node, domain, span)
       WHERE c.node = ANY(mine) AND c.node <> ALL(rebuilt)
      UNION ALL  -- every group of a stale node, over all of time
      SELECT node_id, grp.domain, tstzrange('-infinity', 'infinity')
        FROM fleet_device d CROSS JOIN LATERAL (VALUES (''), (d.nvlink_domain)) grp(domain)
       WHERE d.node_id = ANY(rebuilt) AND d.parent_id IS NULL AND d.device_class = 'gpu'
         AND (grp.domain = '' OR d.nvlink_domain <> '')
      UNION ALL
      SELECT node_id, domain, tstzrange('-infinity', 'infinity') FROM reservations_groupgap
       WHERE node_id = ANY(rebuilt)) c
     GROUP BY c.node, c.domain),
  region AS (
    SELECT c.node, c.domain,
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
    SELECT r.node, r.domain, r.w, range_agg(b.during) AS busy
      FROM region r
      LEFT JOIN fleet_device d ON d.node_id = r.node AND d.parent_id IS NULL
            AND d.device_class = 'gpu' AND (r.domain = '' OR d.nvlink_domain = r.domain)
      LEFT JOIN reservations_booking b ON b.gpu_id = d.id AND b.during && r.w
     GROUP BY r.node, r.domain, r.w)
  INSERT INTO reservations_groupgap (node_id, domain, lo, hi, end_s, length_s)
  SELECT held.node, held.domain, lower(f), upper(f),
         least(extract(epoch FROM upper(f))::float8, 1e15),
         least(extract(epoch FROM upper(f))::float8 - extract(epoch FROM lower(f))::float8,
               1e15)
    FROM held, unnest(tstzmultirange(held.w) - coalesce(held.busy, '{}')) f
   WHERE upper(f) >= now() - interval '1 day'
     AND f <> tstzrange('-infinity', 'infinity');
END $$;

-- Rebuild the stale nodes no one else holds (a periodic job); how many are left stale.
CREATE FUNCTION reservations_groupgap_mend() RETURNS integer LANGUAGE plpgsql AS $$
BEGIN
  PERFORM reservations_groupgap_refresh(array_agg(node_id), array_agg(''::varchar),
                                        array_agg(tstzrange('-infinity', 'infinity')))
     FROM (SELECT DISTINCT node_id FROM reservations_stalegaps) stale HAVING count(*) > 0;
  RETURN (SELECT count(DISTINCT node_id) FROM reservations_stalegaps);
END $$;

-- The groups of these GPUs (their node, and their NVLink domain), each over its span.
CREATE FUNCTION reservations_groupgap_touch(gpus varchar[], spans tstzrange[]) RETURNS void
LANGUAGE sql AS $$
  SELECT reservations_groupgap_refresh(array_agg(d.node_id), array_agg(grp.domain),
                                       array_agg(c.span))
    FROM unnest(gpus, spans) c(gpu, span) JOIN fleet_device d ON d.id = c.gpu
   CROSS JOIN LATERAL (VALUES (''), (d.nvlink_domain)) grp(domain)
   WHERE grp.domain = '' OR d.nvlink_domain <> ''
  HAVING count(*) > 0
$$;

CREATE FUNCTION reservations_booking_gaps() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  gpus varchar[];
  spans tstzrange[];
BEGIN
  IF TG_OP = 'INSERT' THEN
    SELECT array_agg(gpu_id), array_agg(during) INTO gpus, spans FROM booked_now;
  ELSIF TG_OP = 'DELETE' THEN
    SELECT array_agg(gpu_id), array_agg(during) INTO gpus, spans FROM booked_before;
  ELSE  -- both extents of every booking whose GPU or window changed
    SELECT array_agg(x.gpu_id), array_agg(x.during) INTO gpus, spans FROM (
      SELECT side.gpu_id, side.during
        FROM booked_before o JOIN booked_now n ON n.id = o.id
       CROSS JOIN LATERAL (VALUES (o.gpu_id, o.during), (n.gpu_id, n.during))
             side(gpu_id, during)
       WHERE (o.gpu_id, o.during) IS DISTINCT FROM (n.gpu_id, n.during)) x;
  END IF;
  IF gpus IS NOT NULL THEN
    PERFORM reservations_groupgap_touch(gpus, spans);
  END IF;
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
  PERFORM reservations_groupgap_refresh(
    ARRAY[OLD.node_id, OLD.node_id, NEW.node_id, NEW.node_id],
    ARRAY['', OLD.nvlink_domain, '', NEW.nvlink_domain]::varchar[],
    array_fill(tstzrange('-infinity', 'infinity'), ARRAY[4]));
  RETURN NULL;
END $$;
CREATE TRIGGER reservations_device_gaps AFTER UPDATE ON fleet_device FOR EACH ROW
  WHEN ((OLD.node_id, OLD.nvlink_domain, OLD.parent_id, OLD.device_class)
        IS DISTINCT FROM (NEW.node_id, NEW.nvlink_domain, NEW.parent_id, NEW.device_class))
  EXECUTE FUNCTION reservations_device_gaps();

-- The gaps of every group booked so far.
SELECT reservations_groupgap_refresh(array_agg(node), array_agg(domain),
                                     array_agg(tstzrange('-infinity', 'infinity')))
  FROM (SELECT DISTINCT d.node_id AS node, grp.domain
          FROM reservations_booking b JOIN fleet_device d ON d.id = b.gpu_id
         CROSS JOIN LATERAL (VALUES (''), (d.nvlink_domain)) grp(domain)
         WHERE grp.domain = '' OR d.nvlink_domain <> '') booked
HAVING count(*) > 0;
"""

DROP_GAPS_SQL = """
DROP TRIGGER reservations_device_gaps ON fleet_device;
DROP FUNCTION reservations_device_gaps();
DROP TRIGGER reservations_booking_gaps_insert ON reservations_booking;
DROP TRIGGER reservations_booking_gaps_update ON reservations_booking;
DROP TRIGGER reservations_booking_gaps_delete ON reservations_booking;
DROP FUNCTION reservations_booking_gaps();
DROP FUNCTION reservations_groupgap_touch(varchar[], tstzrange[]);
DROP FUNCTION reservations_groupgap_mend();
DROP FUNCTION reservations_groupgap_refresh(varchar[], varchar[], tstzrange[]);
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
            ],
        ),
        migrations.RunSQL(GAPS_SQL, DROP_GAPS_SQL),
    ]
