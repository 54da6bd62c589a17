"""The trace bench's parts on small inputs: the openb format read, the policies' choices,
and our placer driven through the real ledger with the bench's own accounting."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from bench.timeline import DENSE, Clock, Replay, TimedTask, dense_arrivals, read_timed, replay
from bench.trace import (
    Cluster,
    Fgd,
    Ledger,
    Task,
    TraceNode,
    arrivals,
    best_fit,
    first_fit,
    levels,
    read_nodes,
    read_tasks,
)


def test_the_openb_format_is_read_with_cpu_only_tasks_left_out(tmp_path):
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,P100\n"
                     "n1,96000,786432,0,\n")
    pods = tmp_path / "pods.csv"
    pods.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
                    "creation_time,deletion_time,scheduled_time\n"
                    "b,1000,1024,1,220,T4|P100,BE,Running,20,30,20\n"
                    "a,1000,1024,2,1000,,LS,Running,10,30,10\n"
                    "c,1000,1024,0,0,,LS,Running,5,30,5\n")
    assert read_nodes(nodes) == [TraceNode("n0", 2, "P100", 64, 256)]
    assert read_tasks(pods) == [Task("a", 2, 1000), Task("b", 1, 220, ("T4", "P100"))]
    assert Task("b", 1, 220).shares(10) == 3
    assert Task("b", 1, 200).shares(10) == 2  # an exact fifth is two tenths, not three


def test_arrivals_follow_the_trace_then_sample_it_until_capacity():
    tasks = [Task("a", 1, 1000), Task("b", 1, 500)]
    stream = list(arrivals(tasks, 4, seed=1))
    assert stream[:2] == tasks
    assert sum(t.requested for t in stream) >= 4
    assert sum(t.requested for t in stream[:-1]) < 4


def test_fgd_puts_a_share_where_it_keeps_whole_gpus_whole():
    """A share of 3 on a workload of mostly whole-GPU tasks: FGD puts it on the GPU already
    shared, leaving the other node's GPUs whole (as best-fit does); first-fit takes the
    first GPU."""
    cluster = Cluster(["T4", "T4"], [[10, 10], [10, 4]], 10)
    workload = [Task("w", 1, 1000)] * 9 + [Task("s", 1, 300)]
    share = Task("s", 1, 300)
    assert Fgd(workload, 10)(cluster, share, random.Random(1)) == (1, (1,))
    assert first_fit(cluster, share, random.Random(1)) == (0, (0,))
    assert best_fit(cluster, share, random.Random(1)) == (1, (1,))


def test_levels_read_the_unallocated_gpus_as_requests_cross_each_level():
    free = [10.0]

    def place(task):
        free[0] -= task.requested
        return True

    out = levels([Task("a", 8, 1000), Task("b", 1, 1000), Task("c", 1, 500)], 10,
                 lambda: free[0], place)
    assert out == {"80": 2.0, "90": 1.0, "95": 0.5, "100": 0.5}


def test_our_placer_on_the_ledger_books_what_the_bench_counts(root):
    nodes = [TraceNode("n0", 2, "T4", 32, 128), TraceNode("n1", 1, "P100", 16, 64)]
    ledger = Ledger(nodes, 10)
    placed = [ledger.place(task) for task in (
        Task("a", 2, 1000), Task("b", 1, 220), Task("c", 1, 810), Task("d", 1, 1000))]
    # Two T4s whole, then shares of the P100 (3 + 9 = 12 > 10: the second waits and is
    # refused), then no whole GPU is left.
    assert placed == [True, True, False, False]
    assert ledger.allocated == 2 * 10 + 3
    assert ledger.booked_shares() == ledger.allocated
    assert ledger.unallocated() == 0.7


def test_the_timeline_reads_times_classes_and_tenants(tmp_path):
    pods = tmp_path / "pods.csv"
    pods.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
                    "creation_time,deletion_time,scheduled_time\n"
                    "team-b-7,1000,1024,1,500,,BE,Running,300,900,300\n"
                    "team-a-1,1000,1024,2,1000,,Guaranteed,Running,100,400,100\n"
                    "team-a-2,1000,1024,0,0,,LS,Running,5,30,5\n")
    first, second = read_timed(pods, compress=10, tenants=1000)
    assert (first.task, first.arrival, first.run, first.qos) == (Task("team-a-1", 2, 1000),
                                                                 10.0, 300.0, "LS")
    assert (second.arrival, second.run, second.qos, second.gpus) == (30.0, 600.0, "BE", 0.5)
    assert first.tenant != second.tenant  # by name prefix: team-a, team-b


def test_the_window_opens_where_arrivals_become_dense_without_the_early_pods():
    day = 86_400

    def timed(name, arrival, run):
        return TimedTask(Task(name, 1, 1000), arrival, run, "LS", "t0")

    early = [timed("early", 0, 100 * day), timed("later", 5 * day, 60 * day)]
    burst = [timed(f"b{i}", 40 * day + i * 600, 60) for i in range(DENSE + 5)]
    tasks, opening = dense_arrivals(early + burst, compress=1)
    assert opening == 40 * day  # not 0: the window does not start on an empty cluster
    assert tasks == burst


def test_the_ledgers_clock_is_the_replays(db):
    from compute.core.db import database_now

    origin = datetime(2030, 1, 1, tzinfo=UTC)
    clock = Clock(origin)
    try:
        clock.set(3600.5)
        assert database_now() == origin + timedelta(seconds=3600.5)
    finally:
        clock.stop()
    assert database_now() < origin


def test_a_replay_preempts_for_latency_sensitive_work_where_fifo_makes_it_wait(root):
    """Two GPUs held by best-effort work for hours; a latency-sensitive task arrives. Ours
    preempts (after the pool's notice, 120 s) and runs the rest of the preempted work
    later; FIFO makes it wait until the GPUs are free."""
    cluster = [TraceNode("n0", 2, "T4", 32, 128)]

    def timed(name, gpus, arrival, run, qos):
        return TimedTask(Task(name, gpus, 1000), arrival, run, qos, name)

    tasks = [timed("be", 2, 0.0, 10_000.0, "BE"), timed("ls", 1, 100.0, 500.0, "LS")]
    clock = Clock(datetime(2030, 1, 1, tzinfo=UTC))
    try:
        figures, admin = {}, None
        for name, ours in (("ours", True), ("fifo", False)):
            clock.set(0)
            run = Replay(name, ours, cluster, 10, clock, admin)
            admin = run.ledger.admin
            replay(run, tasks, tick=60)
            figures[name] = run.figures((0.0, 100.0), 2)
    finally:
        clock.stop()
    ours, fifo = figures["ours"], figures["fifo"]
    assert (ours["preemptions"], fifo["preemptions"]) == (1, 0)
    assert 120 <= ours["waitP99S"]["LS"] <= 180  # the notice, then the next step
    assert fifo["waitP99S"]["LS"] >= 9_900  # until the best-effort work ended
    assert ours["tasks"] == {"BE": 2, "LS": 1}  # the preempted one asked again
    assert ours["utilisation"] == fifo["utilisation"] == 1.0  # both GPUs held throughout


def test_a_task_waiting_in_the_largest_pool_starts_when_a_smaller_pool_frees(root):
    """Every model accepted: the second task waits in the largest pool (G2, busy for hours)
    and starts when the T4 frees, a minute later, not when the G2 does."""
    cluster = [TraceNode("big", 2, "G2", 32, 128), TraceNode("small", 1, "T4", 32, 128)]
    tasks = [TimedTask(Task("g2", 2, 1000), 0.0, 10_000.0, "Burstable", "a"),
             TimedTask(Task("t4", 1, 1000), 0.0, 60.0, "Burstable", "a"),
             TimedTask(Task("late", 1, 1000), 10.0, 60.0, "Burstable", "a")]
    clock = Clock(datetime(2030, 1, 1, tzinfo=UTC))
    try:
        run = Replay("fifo", False, cluster, 10, clock, None)
        replay(run, tasks, tick=5)  # so "late" waits before the T4 frees
        figures = run.figures((0.0, 10.0), 3)
    finally:
        clock.stop()
    assert figures["waitP99S"]["Burstable"] <= 120  # not the G2's 10,000 s
