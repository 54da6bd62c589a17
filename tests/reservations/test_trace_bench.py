"""The trace bench's parts on small inputs: the openb format read, the policies' choices,
and our placer driven through the real ledger with the bench's own accounting."""

from __future__ import annotations

import random

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
