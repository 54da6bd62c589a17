"""The console in a real Chromium (Debian's binary, driven by Playwright) against
`better-compute dev --sim 4`: sign in, the live board, actions from the console, a viewer and
a tenant member, and a feed that resumes after its stream is cut. Each test saves its
screenshots under build/screenshots/<test name>/."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import psycopg
import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from tests.e2e.conftest import Stack, start_stack, stop_stack
from tests.support.redfish import USERNAME, Emulator, served
from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM_ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
LIVE_WITHIN_MS = 2000


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    assert found, "Debian's chromium is missing: .ci/run installs it"
    return found


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    running = start_stack(tmp_path_factory.mktemp("console"), "--sim", "4")
    yield running
    stop_stack(running)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=chromium(), args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@pytest.fixture(autouse=True)
def pages_closed_after_each_test(browser: Browser) -> Iterator[None]:
    """Each test's pages are closed after it, and their event streams with them (a caller
    holds at most BETTER_COMPUTE_STREAMS_PER_CALLER streams at once)."""
    yield
    for context in browser.contexts:
        context.close()


@pytest.fixture
def shots(request: pytest.FixtureRequest) -> Path:
    folder = ROOT / "build" / "screenshots" / request.node.name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


def base_url(stack: Stack) -> str:
    return stack.env["BETTER_COMPUTE_URL"].removesuffix("/api/compute")


def sign_in(browser: Browser, stack: Stack, token: str, *, width: int = 1280,
            height: int = 800) -> Page:
    """A new browser context signed in with `token`, and every request it makes to a host
    other than the console's recorded (there must be none)."""
    context = browser.new_context(viewport={"width": width, "height": height})
    page = context.new_page()
    page.outside = []  # type: ignore[attr-defined]
    base = base_url(stack)
    page.on("request", lambda r: None if r.url.startswith((base, "blob:", "data:"))
            else page.outside.append(r.url))  # type: ignore[attr-defined]
    page.goto(f"{base}/console/")
    assert page.url.endswith("/console/sign-in")
    page.fill("#token", token)
    page.click("main button")
    expect(page.locator("h1")).to_have_text("Fleet")
    return page


def board_live(page: Page, *, timeout_ms: int = 5000) -> None:
    expect(page.locator("#feed-state")).to_have_text("live", timeout=timeout_ms)



def nodes(stack: Stack) -> list[dict]:
    """The machines (dev's provisioner is a node too, but holds no capacity)."""
    return [n for n in stack.json("nodes", "list")["items"]
            if n["role"] == "node" and n["provisionState"] != "retired"]


def feed_seqs(page: Page) -> list[int]:
    return page.eval_on_selector_all("#feed li[data-seq]",
                                     "items => items.map(li => Number(li.dataset.seq))")


def test_sign_in_and_the_board_shows_every_node(stack, browser, shots):
    page = sign_in(browser, stack, stack.env["BETTER_COMPUTE_TOKEN"])
    board_live(page)
    listed = nodes(stack)
    assert len(listed) == 4
    for node in listed:
        tile = page.locator(f"li.tile#{node['id']}")
        expect(tile).to_contain_text(node["hostname"])
        expect(tile).to_contain_text("simulated")
    expect(page.locator("#overlaps")).to_have_text("0")
    expect(page.locator("#gpus")).to_have_text(re.compile(r"^\d+/32$"))
    page.locator(f"li.tile#{listed[0]['id']} summary").click()  # the GPUs of one node
    expect(page.locator(f"li.tile#{listed[0]['id']} table.gpus tbody tr")).to_have_count(8)
    page.screenshot(path=shots / "board.png", full_page=True)
    assert page.outside == []  # type: ignore[attr-defined]


def test_a_cli_reservation_appears_on_its_tile_and_in_the_feed_within_2s(stack, browser, shots):
    page = sign_in(browser, stack, stack.env["BETTER_COMPUTE_TOKEN"])
    board_live(page)
    rsv = stack.json("reserve", "--pool", stack.env["POOL"], "--gpus", "3", "--for", "1h")
    node_id = rsv["nodeId"]
    made = time.monotonic()
    expect(page.locator(f"li.tile#{node_id} .held")).to_have_text(
        re.compile(r"GPUs 3/8"), timeout=LIVE_WITHIN_MS)
    expect(page.locator("#feed li", has_text=rsv["id"]).first).to_be_visible(
        timeout=LIVE_WITHIN_MS)
    assert time.monotonic() - made < LIVE_WITHIN_MS / 1000
    page.screenshot(path=shots / "after-cli-reservation.png", full_page=True)
    stack.ok("release", rsv["id"])
    expect(page.locator(f"li.tile#{node_id} .held")).to_have_text(re.compile(r"GPUs 0/8"),
                                                                 timeout=LIVE_WITHIN_MS)


def test_reserve_cordon_and_release_from_the_console(stack, browser, shots):
    page = sign_in(browser, stack, stack.env["BETTER_COMPUTE_TOKEN"])
    base = base_url(stack)
    page.goto(f"{base}/console/reservations")
    form = page.locator("form[data-action='reservations.create']")
    form.locator("select[name=deviceClass]").select_option("gpu-share")
    form.locator("button").click()  # dev's pool does not slice its GPUs: said by the form
    expect(form.locator(".field-error[data-for='devices']")).to_contain_text(
        "does not slice its GPUs")
    form.locator("select[name=deviceClass]").select_option("gpu")
    form.locator("input[name=count]").fill("0")  # refused, next to the field it names
    form.locator("button").click()
    expect(form.locator(".field-error[data-for='devices[0].count']")).to_contain_text(
        "greater than or equal to 1")
    page.screenshot(path=shots / "reserve-refused.png", full_page=True)
    form.locator("input[name=count]").fill("2")
    form.locator("select[name=topology]").select_option("nvlink-all")
    with page.expect_navigation():
        form.locator("button").click()
    row = page.locator("#reservations tbody tr").first
    rsv_id = row.get_attribute("id")
    expect(row.locator(".state")).to_have_text(re.compile("placed|binding|active"))
    page.goto(f"{base}/console/")
    board_live(page)
    feed = page.locator("#feed")
    expect(feed.locator("li", has_text=rsv_id).filter(has_text="reservation.active")
           ).to_be_visible()
    expect(feed.locator("li", has_text=rsv_id).filter(has_text="reservation.placed")
           ).to_be_visible()
    shown = stack.json("reservations", "get", rsv_id)
    assert shown["state"] == "active"
    tile = page.locator(f"li.tile#{shown['nodeId']}")
    expect(tile.locator(".held")).to_have_text("GPUs 2/8")
    page.screenshot(path=shots / "reserved.png", full_page=True)

    idle = next(n for n in nodes(stack) if n["id"] != shown["nodeId"])
    page.goto(f"{base}/console/nodes/{idle['id']}")
    cordon = page.locator("form[data-action='nodes.cordon'][data-then='reload']")
    cordon.locator("input[name=reason]").fill("fan replacement")
    with page.expect_navigation():
        cordon.locator("button").click()
    expect(page.locator("#state")).to_contain_text("cordoned")
    page.screenshot(path=shots / "cordoned.png", full_page=True)
    assert stack.json("nodes", "get", idle["id"])["cordoned"] is True
    page.goto(f"{base}/console/")
    expect(page.locator(f"li.tile#{idle['id']}")).to_have_class(re.compile("cordoned"))
    page.goto(f"{base}/console/nodes/{idle['id']}")
    uncordon = page.locator("form[data-action='nodes.uncordon']")
    uncordon.locator("input[name=reason]").fill("fan replaced")
    with page.expect_navigation():
        uncordon.locator("button").click()

    page.goto(f"{base}/console/reservations")
    with page.expect_navigation():
        page.locator(f"tr#{rsv_id} form[data-action='reservations.release'] button").click()
    expect(page.locator(f"tr#{rsv_id} .state")).to_have_text("released")
    page.goto(f"{base}/console/")
    expect(tile.locator(".held")).to_have_text("GPUs 0/8")
    page.screenshot(path=shots / "released.png", full_page=True)
    assert page.outside == []  # type: ignore[attr-defined]
    audit = stack.json("audit", "list", "--action", "node.*")["items"]
    assert [r["action"] for r in audit][-2:] == ["node.cordon", "node.uncordon"]


def test_the_earliest_slot_is_found_and_booked_from_the_console(stack, browser, shots):
    page = sign_in(browser, stack, stack.env["BETTER_COMPUTE_TOKEN"])
    page.goto(f"{base_url(stack)}/console/reservations")
    find = page.locator("form[data-action='capacity.earliest']")
    find.locator("input[name=count]").fill("8")
    find.locator("input[name=hours]").fill("2")
    find.locator("button").click()
    expect(find.locator("output.result")).to_contain_text(" on node_")
    found = find.locator("output.result").text_content()
    page.screenshot(path=shots / "earliest.png", full_page=True)
    reserve = page.locator("form[data-action='reservations.create']")
    reserve.locator("input[name=count]").fill("8")
    reserve.locator("input[name=hours]").fill("2")
    reserve.locator("input[name=atEarliest]").check()
    with page.expect_navigation():
        reserve.locator("button").click()
    rsv_id = page.locator("#reservations tbody tr").first.get_attribute("id")
    booked = stack.json("reservations", "get", rsv_id)
    assert booked["state"] in ("placed", "binding", "active"), booked
    assert booked["nodeId"] in found  # the slot it found
    stack.json("release", rsv_id)
    assert page.outside == []  # type: ignore[attr-defined]


def test_a_viewer_sees_no_action_buttons_and_a_forged_post_is_refused(stack, browser, shots):
    token = stack.ok("tokens", "create", "--name", "watcher", "--role", "viewer",
                     "--query", "token")
    page = sign_in(browser, stack, token)
    base = base_url(stack)
    node_id = nodes(stack)[0]["id"]
    for path in ["reservations", "join-tokens", f"nodes/{node_id}", ""]:
        page.goto(f"{base}/console/{path}")
        expect(page.locator("form.act")).to_have_count(0)
    page.screenshot(path=shots / "viewer-board.png", full_page=True)
    forged = page.evaluate("""async (nodeId) => {
        const call = (headers) => fetch("/api/compute/nodes/cordon", {method: "POST",
            headers: {"Content-Type": "application/json", ...headers},
            body: JSON.stringify({nodeId, reason: "forged"})})
            .then(async (r) => [r.status, (await r.json()).error.code]);
        return [await call({"X-Better-Compute": "1"}), await call({})];
    }""", node_id)
    assert forged == [[403, "permission_denied"], [403, "csrf_header_missing"]]
    assert stack.json("nodes", "get", node_id)["cordoned"] is False
    denied = stack.json("audit", "list", "--action", "nodes.cordon")["items"]
    assert denied
    assert denied[-1]["allowed"] is False


def test_a_tenant_member_sees_only_its_own_reservations(stack, browser, shots):
    pool = stack.env["POOL"]
    stack.ok("tenants", "create", "--slug", "acme")
    stack.ok("pools", "offer", pool, "--to", "acme", "--quota", "gpu=4")
    member = stack.ok("tokens", "create", "--name", "dev", "--role", "member",
                      "--tenant", "acme", "--query", "token")
    as_member = {**stack.env, "BETTER_COMPUTE_TOKEN": member, "BETTER_COMPUTE_TENANT": "acme"}
    mine = stack.json("reserve", "--pool", pool, "--gpus", "1", "--for", "1h", env=as_member)
    theirs = stack.json("reserve", "--pool", pool, "--gpus", "1", "--for", "1h")
    page = sign_in(browser, stack, member, width=390, height=844)  # a phone's width
    page.goto(f"{base_url(stack)}/console/reservations")
    expect(page.locator(f"tr#{mine['id']}")).to_be_visible()
    expect(page.locator(f"tr#{theirs['id']}")).to_have_count(0)
    assert theirs["id"] not in page.content()
    assert page.evaluate("document.documentElement.scrollWidth") <= 390 + 1
    page.screenshot(path=shots / "member-reservations-390px.png", full_page=True)
    for path in ["", "pools", "sandboxes", "nodes", "usage"]:  # every page fits 390 px
        page.goto(f"{base_url(stack)}/console/{path}")
        assert page.evaluate("document.documentElement.scrollWidth") <= 390 + 1, path
    assert page.outside == []  # type: ignore[attr-defined]
    page.goto(f"{base_url(stack)}/console/reservations/{theirs['id']}")
    expect(page.locator("h1")).to_have_text("Not allowed")
    assert stack.cli("release", mine["id"], env=as_member).returncode == 0
    stack.ok("release", theirs["id"])


def test_the_feed_resumes_after_its_stream_is_cut_with_nothing_lost_or_repeated(
        stack, browser, shots):
    page = sign_in(browser, stack, stack.env["BETTER_COMPUTE_TOKEN"])
    board_live(page)
    first = min(feed_seqs(page))
    node_id = nodes(stack)[-1]["id"]

    def churn(reason: str) -> None:  # two events each
        stack.ok("nodes", "cordon", node_id, "--reason", reason)
        stack.ok("nodes", "uncordon", node_id, "--reason", reason)

    page.evaluate("window.consoleFeed.cut(6000)")  # the browser's side drops the stream
    expect(page.locator("#feed-state")).not_to_have_text("live")
    churn("while the stream is cut")
    board_live(page, timeout_ms=15_000)
    for api in api_pids(stack):  # the master and its workers
        os.kill(api, signal.SIGKILL)  # the server's side drops it: dev restarts the API
    expect(page.locator("#feed-state")).not_to_have_text("live")
    assert wait_until(lambda: stack.cli("system", "whoami").returncode == 0, timeout=30)
    churn("after the API restarted")
    board_live(page, timeout_ms=15_000)
    expected = [e["seq"] for e in stack.json("events", "list", "--since",
                                          str(first - 1), "--limit", "1000")["items"]]
    expect(page.locator("#feed li[data-seq]").first).to_have_attribute(
        "data-seq", str(expected[-1]))
    shown = feed_seqs(page)
    assert len(shown) == len(set(shown)), "an event was shown twice"
    assert sorted(s for s in shown if s <= expected[-1]) == expected, "an event was lost"
    page.screenshot(path=shots / "resumed.png", full_page=True)


def api_pids(stack: Stack) -> list[int]:
    """The pids of the dev stack's API server (gunicorn's master and workers on its port)."""
    port = base_url(stack).rsplit(":", 1)[1]
    found = subprocess.run(["pgrep", "-f", f"gunicorn compute.project.asgi:application .*:{port} "],
                           capture_output=True, text=True, check=False).stdout.split()
    return [int(pid) for pid in found]


def test_a_join_token_is_shown_once_and_revoked_from_the_console(stack, browser, shots):
    page = sign_in(browser, stack, stack.env["BETTER_COMPUTE_TOKEN"])
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    page.goto(f"{base_url(stack)}/console/join-tokens")
    form = page.locator("form[data-action='joinTokens.create']")
    form.locator("input[name=ttl]").fill("30")
    form.locator("button:not([type=button])").click()
    secret = form.locator("output.secret")
    expect(secret).to_have_text(re.compile(r"^bcjt_jtk_"))
    shown = secret.inner_text()
    form.locator("button.copy").click()
    assert page.evaluate("navigator.clipboard.readText()") == shown
    page.screenshot(path=shots / "shown-once.png", full_page=True)
    page.reload()
    assert shown not in page.content()  # never again
    token_id = stack.json("join-tokens", "list")["items"][-1]["id"]
    row = page.locator(f"tr#{token_id}")
    expect(row).to_contain_text("live")
    with page.expect_navigation():
        row.locator("button").click()
    expect(page.locator(f"tr#{token_id}")).to_contain_text("revoked")
    assert stack.json("join-tokens", "list")["items"][-1]["revokedAt"]


def test_audit_verify_and_a_proof_download_from_the_console(stack, browser, shots):
    page = sign_in(browser, stack, stack.env["BETTER_COMPUTE_TOKEN"])
    stack.ok("audit", "checkpoint")
    page.goto(f"{base_url(stack)}/console/audit")
    verify = page.locator("form[data-action='audit.verify']")
    verify.locator("button").click()
    expect(verify.locator("output.result")).to_contain_text(re.compile(
        r"^Intact: \d+ event\(s\) and \d+ checkpoint\(s\) recomputed"))
    first = page.locator("#audit tbody tr").last  # the oldest row: inside the checkpoint
    event_id = first.get_attribute("id")
    with page.expect_download() as download:
        first.locator("a.prove").click()
    proof = json.loads(Path(download.value.path()).read_text())
    assert proof["event"]["id"] == event_id
    page.screenshot(path=shots / "audit.png", full_page=True)
    saved = shots / "proof.json"
    saved.write_text(json.dumps(proof))
    checked = stack.cli("audit", "check-proof", str(saved), "--public-key",
                        stack.ok("audit", "public-key"))
    assert checked.returncode == 0, checked.stdout + checked.stderr

    # A row holding an integer past 2**53 (an agent's journal epoch): its proof is the
    # server's, number for number, and verifies.
    [opened] = [r for r in stack.json("audit", "list", "--action", "node.session.open")["items"]
                if r["data"].get("journalEpoch", 0) > 2**53][:1]
    answer = page.request.get(f"{base_url(stack)}/console/audit/{opened['id']}/proof")
    assert answer.ok
    assert "attachment" in answer.headers["content-disposition"]
    saved.write_bytes(answer.body())
    assert json.loads(saved.read_text())["event"]["data"]["journalEpoch"] == \
        opened["data"]["journalEpoch"]
    checked = stack.cli("audit", "check-proof", str(saved), "--public-key",
                        stack.ok("audit", "public-key"))
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_drain_cordons_and_waits_until_nothing_is_held(stack, browser, shots):
    rsv = stack.json("reserve", "--pool", stack.env["POOL"], "--gpus", "1", "--for", "1h")
    page = sign_in(browser, stack, stack.env["BETTER_COMPUTE_TOKEN"])
    page.goto(f"{base_url(stack)}/console/nodes/{rsv['nodeId']}")
    drain = page.locator("form[data-then='drain']")
    drain.locator("input[name=reason]").fill("kernel upgrade")
    drain.locator("button").click()
    expect(page.locator("#status")).to_have_text("Draining: 1 GPU(s) still held")
    assert stack.json("nodes", "get", rsv["nodeId"])["cordoned"] is True
    page.screenshot(path=shots / "draining.png", full_page=True)
    stack.ok("release", rsv["id"])
    expect(page.locator("#status")).to_have_text("Drained: nothing is held", timeout=10_000)
    stack.ok("nodes", "uncordon", rsv["nodeId"], "--reason", "upgraded")


def test_the_board_works_from_the_keyboard(stack, browser, shots):
    page = sign_in(browser, stack, stack.env["BETTER_COMPUTE_TOKEN"])
    for _ in range(40):  # Tab from the top of the page to the first tile
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.closest('li.tile') !== null"):
            break
    else:
        raise AssertionError("no tile can be reached with Tab")
    page.keyboard.press("Enter")
    tile = page.locator("li.tile:has(details[open])")
    expect(tile.locator("table.gpus")).to_be_visible()
    page.screenshot(path=shots / "tile-opened-by-keyboard.png", full_page=True)


def test_a_machine_is_enrolled_by_its_bmc_and_powered_from_the_console(stack, browser, shots,
                                                                        tmp_path):
    system = {"uuid": "5d7a3c1e-0b9f-4e8a-9a51-3c9d0e2f4b61", "name": "metal-console",
              "power_state": "Off", "nics": [{"mac": "52:54:00:cc:dd:01", "ip": "10.0.0.9"}]}
    bmc = Emulator(tmp_path / "bmc", "console-bmc-pw", [system]).start()
    try:
        page = sign_in(browser, stack, stack.env["BETTER_COMPUTE_TOKEN"])
        page.goto(f"{base_url(stack)}/console/nodes")
        form = page.locator("form[data-action='nodes.enroll']")
        form.locator("input[name=bmc]").fill("redfish+http://10.9.9.9/redfish/v1/Systems/1")
        form.locator("input[name='credentials.username']").fill(USERNAME)
        form.locator("input[name='credentials.password']").fill("console-bmc-pw")
        form.locator("button").click()
        expect(form.locator(".field-error[data-for=bmc]")).to_contain_text(
            "redfish+http sends the BMC")  # the API's refusal, next to the field it names
        form.locator("input[name=bmc]").fill(bmc.bmc(system["uuid"]))
        form.locator("input[name=hostname]").fill("metal-console")
        with page.expect_navigation():
            form.locator("button").click()
        machine = next(n for n in stack.json("nodes", "list")["items"]
                       if n["hostname"] == "metal-console")
        assert wait_until(lambda: stack.json("nodes", "get", machine["id"])[
            "provisionState"] == "available", 60)
        page.goto(f"{base_url(stack)}/console/nodes/{machine['id']}")
        expect(page.locator("#provision-state")).to_have_text("available")
        expect(page.locator("#bmc-reachable")).to_have_text("yes")
        power = page.locator("form[data-action='nodes.power']")
        power.locator("select[name=state]").select_option("on")
        with page.expect_navigation():
            power.locator("button").click()
        assert wait_until(lambda: bmc.system(system["uuid"])["PowerState"] == "On", 60)
        assert wait_until(lambda: stack.json("nodes", "get", machine["id"])["bmc"][
            "powerState"] == "On", 60)
        page.reload()
        expect(page.locator("#power")).to_have_text("On")
        page.screenshot(path=shots / "bare-metal-node.png", full_page=True)
        assert "console-bmc-pw" not in page.content()
        (tmp_path / "media").mkdir()
        (tmp_path / "media" / "deploy.iso").write_bytes(b"\0" * 4096)
        with served(tmp_path / "media") as url:
            digest = hashlib.sha256(b"\0" * 4096).hexdigest()
            for name in ("console-os", "console-ramdisk"):
                stack.ok("images", "create", "--pool", stack.env["POOL"], "--name", name,
                         *[arg for part in ("kernel", "initrd", "disk") for arg in (
                             f"--{part}", f"{url}/deploy.iso", f"--{part}-sha256", digest)])
            page.reload()
            deploy = page.locator("form[data-action='nodes.deploy']")
            deploy.locator("select[name=image]").select_option("console-os")
            deploy.locator("select[name=ramdisk]").select_option("console-ramdisk")
            with page.expect_navigation():
                deploy.locator("button").click()
            expect(page.locator("#provision-state")).to_have_text("deploying")
            expect(page.locator("#deployment")).to_contain_text("console-os via cd")
            assert wait_until(lambda: bmc.get(f"/redfish/v1/Systems/{system['uuid']}"
                                              "/VirtualMedia/Cd")["Inserted"], 120), \
                stack.json("nodes", "get", machine["id"])
        abort = page.locator("form[data-action='nodes.abort']")
        abort.locator("input[name=reason]").fill("wrong image")
        with page.expect_navigation():
            abort.locator("button").click()
        expect(page.locator("#provision-state")).to_have_text("available")
    finally:
        bmc.stop()


def test_who_holds_a_node_hostnames_end_times_and_the_mig_field(stack, browser, shots):
    page = sign_in(browser, stack, stack.env["BETTER_COMPUTE_TOKEN"])
    base = base_url(stack)
    rsv = stack.json("reserve", "--pool", stack.env["POOL"], "--gpus", "2", "--for", "1h")
    node = stack.json("nodes", "get", rsv["nodeId"])
    page.goto(f"{base}/console/nodes/{node['id']}")
    expect(page.locator("#schedulable")).to_have_text("yes")
    held = page.locator(f"#node-reservations tr#{rsv['id']}")
    expect(held).to_contain_text("root")
    expect(held).to_contain_text("2 GPUs")
    expect(page.locator("#inventory tbody tr").first).to_contain_text("gpu")
    page.screenshot(path=shots / "node-held-by.png", full_page=True)

    page.goto(f"{base}/console/reservations")
    row = page.locator(f"#reservations tr#{rsv['id']}")
    expect(row).to_contain_text(node["hostname"])
    expect(row).not_to_contain_text(node["id"])
    profile = page.locator("form[data-action='reservations.create'] label.mig-only")
    expect(profile).to_be_hidden()  # whole GPUs have no MIG profile
    page.locator("form[data-action='reservations.create'] select[name=deviceClass]"
                 ).select_option("mig")
    expect(profile).to_be_visible()
    page.screenshot(path=shots / "reservations-mig-field.png", full_page=True)
    stack.ok("release", rsv["id"])
    ended = stack.json("reservations", "get", rsv["id"])["endedAt"]
    page.goto(f"{base}/console/reservations")
    end = page.locator(f"#reservations tr#{rsv['id']} td.end")
    expect(end).to_contain_text("(released)")
    assert ended[:16].replace("T", " ") in end.inner_text()
    page.goto(f"{base}/console/reservations/{rsv['id']}")
    expect(page.locator("#ended")).to_contain_text("released")
    page.screenshot(path=shots / "reservation-ended.png", full_page=True)


def test_the_audit_log_pages_back_and_names_its_actors(stack, browser, shots):
    page = sign_in(browser, stack, stack.env["BETTER_COMPUTE_TOKEN"])
    page.goto(f"{base_url(stack)}/console/audit")
    rows = page.locator("#audit tbody tr")
    expect(rows).to_have_count(50)
    actors = page.locator("#audit td.actor").all_inner_texts()
    assert not any(actor.startswith("prn_") for actor in actors), actors
    assert "admin" in " ".join(actors) or any(a for a in actors), actors
    newest = int(rows.first.locator("td").first.inner_text())
    with page.expect_navigation():
        page.locator("#older").click()
    older = int(page.locator("#audit tbody tr").first.locator("td").first.inner_text())
    assert older == newest - 50
    page.screenshot(path=shots / "audit-older.png", full_page=True)
    with page.expect_navigation():
        page.locator("#newer").click()
    assert int(page.locator("#audit tbody tr").first.locator("td").first.inner_text()) == newest


def test_a_clone_shows_why_it_is_refused_and_is_retired_from_the_console(
        stack, browser, shots, tmp_path):
    from tests.e2e.test_joined_by_hand import join_by_hand, run_agent

    original = nodes(stack)[0]
    clone = join_by_hand(stack, tmp_path, "clone", "--hostname", original["hostname"])
    agent = run_agent(tmp_path, "clone")
    try:
        assert wait_until(lambda: stack.json("nodes", "get", clone)["inventoryRefused"], 60)
        page = sign_in(browser, stack, stack.env["BETTER_COMPUTE_TOKEN"])
        board_live(page)
        tile = page.locator(f"li.tile#{clone}")
        expect(tile).to_have_class(re.compile("refused"))
        expect(tile.locator(".held")).to_have_text("no inventory yet")
        page.screenshot(path=shots / "board-clone.png", full_page=True)
        page.goto(f"{base_url(stack)}/console/nodes/{clone}")
        expect(page.locator("#inventory-refused")).to_contain_text(original["id"])
        expect(page.locator("#schedulable")).to_contain_text("inventory refused")
        page.screenshot(path=shots / "node-refused.png", full_page=True)
        retire = page.locator("form[data-action='nodes.retire']")
        retire.locator("input[name=reason]").fill("a clone of " + original["hostname"])
        with page.expect_navigation():
            retire.locator("button").click()
        expect(page.locator("#state")).to_contain_text("retired")
        page.goto(f"{base_url(stack)}/console/")
        expect(page.locator(f"li.tile#{clone}")).to_have_count(0)
        expect(page.locator(f"li.tile#{original['id']}")).to_have_count(1)
    finally:
        agent.terminate()
        agent.wait(timeout=30)


def ledger_bookings(stack: Stack, *reservation_ids: str) -> dict[str, list[tuple]]:
    """Each reservation's bookings in the ledger: (device id, start, end)."""
    found: dict[str, list[tuple]] = {rsv: [] for rsv in reservation_ids}
    with psycopg.connect(stack.env["DATABASE_URL"]) as conn:
        for rsv, device, lower, upper in conn.execute("""
                SELECT a.reservation_id, b.device_id, lower(b.during), upper(b.during)
                FROM reservations_booking b JOIN reservations_allocation a
                  ON a.id = b.allocation_id
                WHERE a.reservation_id = ANY(%s) AND a.ended_at IS NULL""",
                                                      [list(reservation_ids)]):
            found[rsv].append((device, lower, upper))
    return found


def drawn_at(page: Page, selector: str) -> list[dict]:
    """Each bar a selector finds: its device, times, and where it is drawn."""
    return page.eval_on_selector_all(selector, """rects => rects.map(r => ({
        device: r.dataset.device, start: r.dataset.start, end: r.dataset.end,
        x: Number(r.getAttribute('x')), y: Number(r.getAttribute('y'))}))""")


def check_drawn_as_booked(page: Page, selector: str, booked: list[tuple], *,
                          among: bool = False) -> None:
    """The bars are the ledger's bookings (`among`: are among the bars, which hold others
    too): same devices and times, on their device's row, at the x their times give on the
    calendar's axis."""
    svg = page.locator("#calendar-svg")
    start, end = (datetime.fromisoformat(svg.get_attribute(a)) for a in ("data-from",
                                                                        "data-to"))
    label, width = (float(svg.get_attribute(a)) for a in ("data-label", "data-width"))
    bars = sorted(drawn_at(page, selector), key=lambda b: b["device"])
    if among:
        starts = {(d, lower) for d, lower, _ in booked}
        bars = [b for b in bars if any(
            d == b["device"] and abs(datetime.fromisoformat(b["start"]) - lower)
            < timedelta(milliseconds=1) for d, lower in starts)]
    assert [b["device"] for b in bars] == sorted(d for d, _, _ in booked)
    for bar, (device, lower, upper) in zip(bars, sorted(booked), strict=True):
        assert abs(datetime.fromisoformat(bar["start"]) - lower) < timedelta(milliseconds=1)
        assert abs(datetime.fromisoformat(bar["end"]) - upper) < timedelta(milliseconds=1)
        row_y = float(page.locator(f"g.row[data-device='{device}']").get_attribute("data-y"))
        assert bar["y"] == row_y + 1
        at = (max(lower, start) - start) / (end - start)
        assert abs(bar["x"] - (label + at * (width - label))) < 0.5


def test_the_pool_calendar_draws_each_booking_at_its_gpus_and_times_and_follows_live(
        stack, browser, shots):
    pool, base = stack.env["POOL"], base_url(stack)
    now_rsv = stack.json("reserve", "--pool", pool, "--gpus", "2", "--for", "2h")
    later = stack.json("reserve", "--pool", pool, "--gpus", "1", "--for", "1h",
                       "--start", "+3h")
    page = sign_in(browser, stack, stack.env["BETTER_COMPUTE_TOKEN"])
    page.goto(f"{base}/console/pools/{pool}?span=6h")
    expect(page.locator("#feed-state")).to_have_text("live", timeout=5000)
    booked = ledger_bookings(stack, now_rsv["id"], later["id"])
    assert [len(booked[now_rsv["id"]]), len(booked[later["id"]])] == [2, 1]
    for rsv in (now_rsv, later):
        check_drawn_as_booked(page, f"rect.bar[data-rsv='{rsv['id']}']", booked[rsv["id"]])
    expect(page.locator("#now")).to_have_count(1)
    page.screenshot(path=shots / "calendar-6h.png", full_page=True)

    live = stack.json("reserve", "--pool", pool, "--gpus", "1", "--for", "1h")
    assert live["state"] == "active", live
    expect(page.locator(f"rect.bar[data-rsv='{live['id']}']")).to_have_count(
        1, timeout=LIVE_WITHIN_MS + 3000)
    check_drawn_as_booked(page, f"rect.bar[data-rsv='{live['id']}']",
                          ledger_bookings(stack, live["id"])[live["id"]])

    # What if: pointing at a free time draws where one GPU would go, books nothing.
    page.locator("#whatif input[name=count]").fill("1")
    box = page.locator("#calendar-svg").bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.9, box["y"] + box["height"] / 2)
    expect(page.locator("#ghost rect.whatif")).to_have_count(1, timeout=5000)
    expect(page.locator("#whatif-answer")).to_contain_text("would go on")
    page.screenshot(path=shots / "calendar-what-if.png", full_page=True)

    page.locator("a[href*='span=1w']").first.click()
    expect(page.locator(".calendar-nav [aria-current]")).to_have_text("1w")
    for rsv in (now_rsv, later, live):
        check_drawn_as_booked(page, f"rect.bar[data-rsv='{rsv['id']}']",
                              ledger_bookings(stack, rsv["id"])[rsv["id"]])
    page.screenshot(path=shots / "calendar-1w.png", full_page=True)
    page.locator(f"rect.bar[data-rsv='{later['id']}']").click()
    expect(page).to_have_url(re.compile(f"/console/reservations/{later['id']}$"))
    for rsv in (now_rsv, later, live):
        stack.ok("release", rsv["id"])
    assert page.outside == []  # type: ignore[attr-defined]


def test_on_the_calendar_another_tenants_booking_is_busy_and_what_waits_is_at_its_start(
        stack, browser, shots):
    pool, base = stack.env["POOL"], base_url(stack)
    stack.ok("tenants", "create", "--slug", "calendar-co")
    stack.ok("pools", "offer", pool, "--to", "calendar-co", "--quota", "gpu=8")
    member = stack.ok("tokens", "create", "--name", "cal", "--role", "member",
                      "--tenant", "calendar-co", "--query", "token")
    as_member = {**stack.env, "BETTER_COMPUTE_TOKEN": member,
                 "BETTER_COMPUTE_TENANT": "calendar-co"}
    blockers = []  # whole machines, by the pool's owner, until none is left
    for _ in range(8):
        blocker = stack.json("reserve", "--pool", pool, "--gpus", "8", "--for", "2h",
                             "--wait", "0")
        if blocker["state"] == "pending":
            stack.ok("release", blocker["id"])
            break
        blockers.append(blocker)
    assert len(blockers) >= 4, blockers
    waiting = stack.json("reserve", "--pool", pool, "--gpus", "4", "--for", "1h", "--wait", "0",
                         env=as_member)
    assert waiting["state"] == "pending"
    page = sign_in(browser, stack, member)
    page.goto(f"{base}/console/pools/{pool}?span=6h")
    booked = ledger_bookings(stack, *(b["id"] for b in blockers))
    busy = [row for rows in booked.values() for row in rows]
    check_drawn_as_booked(page, "rect.bar.busy", busy, among=True)
    content = page.content()
    assert not any(b["id"] in content for b in blockers)
    assert "root" not in page.locator("#calendar").inner_text()
    pending = drawn_at(page, f"rect.pending[data-rsv='{waiting['id']}']")
    assert len(pending) == 4
    ends = {upper for rows in booked.values() for _, _, upper in rows}
    [start] = {datetime.fromisoformat(p["start"]) for p in pending}
    assert min(abs(start - end) for end in ends) < timedelta(milliseconds=1)
    expect(page.locator(f"#waiting-{waiting['id']}")).to_contain_text("earliest")
    page.screenshot(path=shots / "calendar-member-busy-and-waiting.png", full_page=True)
    assert stack.cli("release", waiting["id"], env=as_member).returncode == 0
    for blocker in blockers:
        stack.ok("release", blocker["id"])
