"""`bench.failover` at a small size: a three-member Patroni cluster (synchronous replication)
under the control plane, its leader killed with -9 while clients book and release. Nothing
acknowledged is lost, nothing overlaps, no node turns unreachable, the work queue catches
up, an event watcher resumes without a gap, and a killed gateway's nodes move to the
other."""

from __future__ import annotations

import pytest

from bench.failover import failover


@pytest.mark.campaign
@pytest.mark.timeout(900)  # a Patroni cluster and a stack: ~150 s, more when loaded
def test_a_patroni_failover_under_load_loses_nothing_acknowledged():
    result = failover(nodes=2, clients=2, before=8, after=25)
    assert result["acknowledged"] > 0
    assert result["present"] == result["acknowledged"], result
    assert result["overlaps"] == 0
    assert result["outage"] > 0, result  # the leader's loss was felt, and writes came back
    assert result["unreachable"] == 0, result
    assert result["nodes"] == 2
    assert result["gatewayMoved"] >= 1
    assert result["events"] > 0
    assert (result["missed"], result["repeated"]) == (0, 0), result  # the watch resumed
