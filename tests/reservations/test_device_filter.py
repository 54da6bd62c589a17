import pytest

from compute.core.errors import InvalidArgument
from fleet.models import Device
from reservations.device_filter import parse_selector
from tests.factories import make_node


@pytest.fixture
def devices(root):
    site = root("sites.create", kind="shared", region="eu-1")
    pool = root("pools.create", siteId=site["id"], gpuModel="H100", **{"class": "metal-host"})
    make_node(pool["id"], gpus=2, domains=(2,))
    make_node(pool["id"], gpus=2, domains=(1, 1), product="H100-PCIE-40GB", vram=40)
    return Device.objects.all()


@pytest.mark.parametrize(("text", "expected"), [
    ("vramGiB >= 80", 2),
    ("vramGiB > 80", 0),
    ("vramGiB >= 40 && product == 'H100-PCIE-40GB'", 2),
    ('model == "H100" and index < 1', 2),
    ("model != 'H100'", 0),
    ("product != 'H100-PCIE-40GB'", 2),
    ("", 4),
])
def test_selector_filters_devices_in_sql(devices, text, expected):
    assert devices.filter(parse_selector(text).to_q()).count() == expected


@pytest.mark.parametrize("text", [
    "__import__('os').system('true')", "vramGiB >= ", "colour == 'red'", "vramGiB ~ 3",
    "vramGiB >= 80 || index == 1", "a" * 301, "vramGiB >= 80; DROP TABLE fleet_device",
    "vramGiB == 'x'", "product > 3", "index < 99999999999",
])
def test_bad_selectors_are_invalid_argument(text):
    with pytest.raises(InvalidArgument) as caught:
        parse_selector(text)
    assert caught.value.details["field"] == "selector"
