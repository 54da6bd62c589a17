"""The agent's own check of a spec's holds against each other: whole GPUs, MIG instances
and shares of one GPU, as the ledger's constraints allow them."""

from __future__ import annotations

import pytest

from bcd.contract.holds import BadHold, Claims, Hold, share_uuid

GPU0, GPU1 = "GPU-aaaa-0", "GPU-aaaa-1"
MIG_A, MIG_B = "MIG-aaaa-0-0", "MIG-aaaa-0-1"
MACHINE = [{"uuid": GPU0, "mig": [{"uuid": MIG_A}, {"uuid": MIG_B}]},
           {"uuid": GPU1, "mig": []},
           {"uuid": "GPU-sick", "health": "unhealthy", "mig": [{"uuid": "MIG-sick-0"}]}]


def hold(allocation: str, *gpus: str, shares: tuple[str, ...] = ()) -> Hold:
    return Hold(allocation, "rsv_x", gpus, shares=shares)


def test_parts_of_one_gpu_go_together_and_exclude_the_whole_gpu():
    claims = Claims.of(MACHINE)
    assert claims.take("a1", hold("a1", MIG_A)) == ""
    assert claims.take("a2", hold("a2", MIG_B)) == ""
    assert claims.take("a3", hold("a3", GPU0)) == "overlap"
    assert claims.take("a4", hold("a4", MIG_A)) == "overlap"
    assert claims.take("a5", hold("a5", GPU1)) == ""


def test_a_whole_gpu_excludes_its_instances_and_shares():
    claims = Claims.of(MACHINE)
    assert claims.take("a1", hold("a1", GPU1)) == ""
    assert claims.take("a2", hold("a2", GPU1, shares=(share_uuid(GPU1, 1),))) == "overlap"
    claims = Claims.of(MACHINE)
    assert claims.take("a1", hold("a1", GPU0)) == ""
    assert claims.take("a2", hold("a2", MIG_B)) == "overlap"


def test_shares_of_one_gpu_each_go_once():
    claims = Claims.of(MACHINE)
    first, second = share_uuid(GPU1, 1), share_uuid(GPU1, 2)
    assert claims.take("a1", hold("a1", GPU1, shares=(first,))) == ""
    assert claims.take("a2", hold("a2", GPU1, shares=(second,))) == ""
    assert claims.take("a3", hold("a3", GPU1, shares=(first,))) == "overlap"
    assert claims.take("a4", hold("a4", GPU1)) == "overlap"


def test_missing_or_unhealthy_devices_are_missing():
    claims = Claims.of(MACHINE)
    assert claims.take("a1", hold("a1", "MIG-sick-0")) == "device-missing"
    assert claims.take("a2", hold("a2", "GPU-gone")) == "device-missing"


@pytest.mark.parametrize("shares", [["GPU-other:share-1"], ["GPU-aaaa-1:share-0"],
                                    ["GPU-aaaa-1:share-1", "GPU-aaaa-1:share-1"], "x"])
def test_a_spec_naming_shares_of_gpus_it_does_not_hold_is_refused(shares):
    entry = {"allocationId": "alloc_01m8qrkhzjz9r5qzkh956btdj6",
             "reservationId": "rsv_01m8qrkhzjz9r5qzkh956btdj6", "gpus": [GPU1],
             "shares": shares}
    with pytest.raises(BadHold, match="shares"):
        Hold.from_wire(entry)
