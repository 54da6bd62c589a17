import pytest

from compute.errors import InvalidArgument
from reservations.device_filter import parse_selector
from reservations.placement import FreeDevice

H100 = FreeDevice(id="d", uuid="u", index=3, product="H100-SXM5-80GB", model="H100",
                  vram_gib=80, nvlink_domain="nv0")


@pytest.mark.parametrize(("text", "expected"), [
    ("vramGiB >= 80", True),
    ("vramGiB > 80", False),
    ("vramGiB >= 80 && product == 'H100-SXM5-80GB'", True),
    ('model == "H100" and index < 4', True),
    ("model != 'H100'", False),
    ("vramGiB == 'x'", False),
    ("", True),
])
def test_selector_matches(text, expected):
    assert parse_selector(text)(H100) is expected


@pytest.mark.parametrize("text", [
    "__import__('os').system('true')", "vramGiB >= ", "colour == 'red'", "vramGiB ~ 3",
    "vramGiB >= 80 || index == 1", "a" * 301,
])
def test_bad_selectors_are_invalid_argument(text):
    with pytest.raises(InvalidArgument) as caught:
        parse_selector(text)
    assert caught.value.details["field"] == "selector"
