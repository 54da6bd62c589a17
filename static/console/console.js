// The console's behaviour: every action is a call to the API envelope with the session
// cookie and the X-Better-Compute header; the fleet board follows the events watch stream.
"use strict";

const CSRF_HEADER = "X-Better-Compute";

async function api(action, body) {
  const [group, method] = action.split(".");
  const response = await fetch(`/api/compute/${group}/${method}`, {
    method: "POST", credentials: "same-origin",
    headers: {"Content-Type": "application/json", [CSRF_HEADER]: "1"},
    body: JSON.stringify(body),
  });
  let envelope;
  try { envelope = await response.json(); }
  catch { envelope = {ok: false, error: {message: `HTTP ${response.status}`, details: {}}}; }
  return envelope;
}

function say(message) {
  const status = document.getElementById("status");
  if (status) status.textContent = message;
}

// A form's named fields as the API's body: numbers for number inputs (times data-scale),
// nested objects for dotted names, blanks left out.
function bodyOf(form) {
  const body = {};
  for (const field of form.querySelectorAll("[name]")) {
    if (field.value === "" || field.type === "submit") continue;
    if (field.type === "checkbox" && !field.checked) continue;
    let value = field.type === "checkbox" ? true : field.value;
    if (field.type === "number") value = Number(value) * Number(field.dataset.scale || 1);
    const path = field.name.split(".");
    let into = body;
    for (const key of path.slice(0, -1)) into = into[key] = into[key] || {};
    into[path[path.length - 1]] = value;
  }
  return SHAPES[form.dataset.shape] ? SHAPES[form.dataset.shape](body) : body;
}

function requestShape(fields) {
  const device = {class: fields.deviceClass || "gpu", count: fields.count,
                  topology: fields.topology};
  if (device.class === "mig") device.profile = fields.profile;
  return {poolId: fields.poolId, duration: Math.round(fields.hours * 3600000),
          devices: [device]};
}

// datetime-local fields (the browser's local time) as the API's ISO 8601 instants.
function instants(body, fields, names) {
  for (const name of names) if (fields[name]) body[name] = new Date(fields[name]).toISOString();
  return body;
}

const SHAPES = {
  reserve(fields) {
    const body = instants(requestShape(fields), fields, ["start"]);
    if (fields.atEarliest) body.atEarliest = true;
    return body;
  },
  earliest(fields) {
    return instants(requestShape(fields), fields, ["after", "before"]);
  },
};

function showError(form, error) {
  const field = (error.details || {}).field;
  const slot = field && form.querySelector(`.field-error[data-for="${CSS.escape(field)}"]`);
  const general = form.querySelector(".form-error");
  if (slot) {
    slot.textContent = error.message;
    const input = form.querySelector(`[data-field="${CSS.escape(field)}"]`);
    if (input) { input.setAttribute("aria-invalid", "true"); input.focus(); }
  } else if (general) {
    general.textContent = error.message;
  }
}

const AFTER = {
  reload() { window.location.reload(); },
  reveal(form, result) {
    const box = form.querySelector(".reveal");
    box.querySelector("output").textContent = result[box.querySelector("output").dataset.key];
    box.hidden = false;
  },
  show(form, result) {
    form.querySelector("output.result").textContent = JSON.stringify(result, null, 2);
  },
  verified(form, result) {
    const out = form.querySelector("output.result");
    out.className = `result ${result.ok ? "ok" : "bad"}`;
    out.textContent = result.ok
      ? `Intact: ${result.checkedEvents} event(s) and ${result.checkedCheckpoints} ` +
        "checkpoint(s) recomputed; every row, position and signature matches."
      : `Broken at position ${result.firstBadPosition}: ${result.problem}`;
  },
  earliest(form, result) {
    const out = form.querySelector("output.result");
    out.textContent = result.found
      ? `${new Date(result.window.start).toLocaleString()} to ` +
        `${new Date(result.window.end).toLocaleString()} on ${result.nodeId} ` +
        `(GPUs ${result.devices.join(", ")})`
      : `No slot: ${result.reason}`;
  },
  async drain(form) {
    for (;;) {
      const page = await fetch(window.location.href, {credentials: "same-origin"});
      const doc = new DOMParser().parseFromString(await page.text(), "text/html");
      const held = Number(doc.getElementById("held").dataset.held);
      document.getElementById("held").textContent = `${held} GPU(s)`;
      say(held ? `Draining: ${held} GPU(s) still held` : "Drained: nothing is held");
      if (!held) return;
      await new Promise((done) => setTimeout(done, 2000));
    }
  },
};

// form.act changes something through the envelope; form.ask only reads (a viewer has it too).
async function submit(event) {
  const form = event.target.closest("form.act, form.ask");
  if (!form) return;
  event.preventDefault();
  form.querySelectorAll(".field-error, .form-error").forEach((slot) => { slot.textContent = ""; });
  form.querySelectorAll("[aria-invalid]").forEach((input) => input.removeAttribute("aria-invalid"));
  const button = form.querySelector("button:not([type=button])");
  if (button) button.disabled = true;
  try {
    const envelope = await api(form.dataset.action, bodyOf(form));
    if (!envelope.ok) { showError(form, envelope.error); return; }
    say(`${form.dataset.action}: done`);
    await (AFTER[form.dataset.then] || (() => {}))(form, envelope.result);
  } finally {
    if (button) button.disabled = false;
  }
}

// The MIG profile field is shown only when MIG instances are asked for.
function showProfileFor(select) {
  const label = select.form && select.form.querySelector(".mig-only");
  if (label) label.hidden = select.value !== "mig";
}

document.addEventListener("change", (event) => {
  if (event.target.name === "deviceClass") showProfileFor(event.target);
});
document.addEventListener("submit", submit);
document.addEventListener("click", (event) => {
  const copy = event.target.closest("button.copy");
  if (copy) {
    navigator.clipboard.writeText(copy.parentElement.querySelector("output").textContent)
      .then(() => say("Copied"), () => say("Copy it by hand: the clipboard is not allowed"));
  }
});

// The pool calendar's "what if": pointing at a time asks capacity.preview where the form's
// request would go from then, and draws it dashed on the rows of its devices. One question
// at a time; the latest pointer position wins.
class WhatIf {
  constructor(form) {
    this.form = form;
    this.asking = false;
    this.wanted = null;
    document.addEventListener("mousemove", (event) => this.point(event));
  }

  point(event) {
    const svg = document.getElementById("calendar-svg");
    if (!svg || !svg.contains(event.target)) return;
    const at = svg.createSVGPoint();
    at.x = event.clientX; at.y = event.clientY;
    const x = at.matrixTransform(svg.getScreenCTM().inverse()).x;
    const label = Number(svg.dataset.label), width = Number(svg.dataset.width);
    if (x < label) return;
    const from = Date.parse(svg.dataset.from), to = Date.parse(svg.dataset.to);
    this.wanted = new Date(from + (x - label) / (width - label) * (to - from));
    this.ask();
  }

  async ask() {
    if (this.asking || !this.wanted) return;
    this.asking = true;
    const start = this.wanted;
    this.wanted = null;
    try {
      const count = Number(this.form.elements.count.value || 1);
      const hours = Number(this.form.elements.hours.value || 1);
      const envelope = await api("capacity.preview", {
        poolId: this.form.dataset.pool, duration: Math.round(hours * 3600000),
        devices: [{class: "gpu", count}],
        ...(start > Date.now() ? {start: start.toISOString()} : {})});
      this.draw(envelope, count);
    } finally {
      this.asking = false;
      if (this.wanted) this.ask();
    }
  }

  draw(envelope, count) {
    const svg = document.getElementById("calendar-svg");
    const ghost = document.getElementById("ghost");
    const answer = document.getElementById("whatif-answer");
    if (!svg || !ghost) return;
    ghost.replaceChildren();
    if (!envelope.ok) { answer.textContent = envelope.error.message; return; }
    const result = envelope.result;
    if (!result.fits) { answer.textContent = `${count} GPU(s) would not fit: ${result.reason}`; return; }
    const label = Number(svg.dataset.label), width = Number(svg.dataset.width);
    const from = Date.parse(svg.dataset.from), to = Date.parse(svg.dataset.to);
    let node = result.nodeId;
    const x = (t) => label + (Math.min(Math.max(Date.parse(t), from), to) - from) / (to - from) * (width - label);
    for (const uuid of result.devices) {
      const row = svg.querySelector(`g.row[data-uuid="${CSS.escape(uuid)}"]`);
      if (!row) continue;
      node = row.dataset.node;
      const rect = document.createElementNS("http://www.w3.org/2000/svg", "rect");
      rect.setAttribute("class", "whatif");
      rect.setAttribute("x", x(result.window.start));
      rect.setAttribute("width", Math.max(x(result.window.end) - x(result.window.start), 1));
      rect.setAttribute("y", Number(row.dataset.y) + 1);
      rect.setAttribute("height", Number(row.dataset.height) - 2);
      ghost.append(rect);
    }
    answer.textContent = `${count} GPU(s) would go on ${node} from ` +
      `${new Date(result.window.start).toLocaleString()} to ${new Date(result.window.end).toLocaleString()}`;
  }
}

// The live board: follow the events watch stream from the last event shown, add each new
// event to the feed once (by sequence number), and fetch the tiles again. A cut stream is
// resumed from the last sequence seen, so nothing is lost or shown twice.
class Feed {
  constructor(list) {
    this.list = list;
    this.since = Number(list.dataset.since || 0);
    this.seen = new Set([...list.querySelectorAll("li[data-seq]")].map((li) => Number(li.dataset.seq)));
    this.board = document.querySelector("[data-refresh]");
    this.state = document.getElementById("feed-state");
    this.refresh = null;
    this.controller = null;
    this.heldUntil = 0;
  }

  async run() {
    for (;;) {
      const wait = this.heldUntil - Date.now();
      if (wait > 0) await new Promise((done) => setTimeout(done, wait));
      try {
        await this.follow();
        this.show("reconnecting…");
      } catch (error) {
        this.show(error.name === "AbortError" ? "cut, resuming…" : "reconnecting…");
      }
      await new Promise((done) => setTimeout(done, 1000));
    }
  }

  async follow() {
    this.controller = new AbortController();
    const url = `${this.list.dataset.watch}&since=${this.since}`;
    const response = await fetch(url, {credentials: "same-origin", signal: this.controller.signal,
                                       headers: {[CSRF_HEADER]: "1"}});
    if (response.status === 401) { window.location.assign("/console/sign-in"); return; }
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    this.show("live");
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffered = "";
    for (;;) {
      const {value, done} = await reader.read();
      if (done) return;
      buffered += decoder.decode(value, {stream: true});
      const lines = buffered.split("\n");
      buffered = lines.pop();
      for (const line of lines) if (line.trim()) this.add(JSON.parse(line));
    }
  }

  add(event) {
    this.since = Math.max(this.since, event.seq);
    if (this.seen.has(event.seq)) return;
    this.seen.add(event.seq);
    const item = document.createElement("li");
    item.dataset.seq = event.seq;
    item.innerHTML = "<code></code> <span class=type></span> <span class=subject></span>";
    item.querySelector("code").textContent = event.seq;
    item.querySelector(".type").textContent = event.type;
    item.querySelector(".subject").textContent = event.subject;
    this.list.prepend(item);
    while (this.list.children.length > 200) this.list.lastElementChild.remove();
    this.scheduleRefresh();
  }

  scheduleRefresh() {
    if (this.refresh || !this.board) return;
    this.refresh = setTimeout(async () => {
      this.refresh = null;
      const response = await fetch(this.board.dataset.refresh, {credentials: "same-origin"});
      if (response.ok) {
        const open = [...this.board.querySelectorAll("details[open]")].map((d) => d.closest("li").id);
        this.board.innerHTML = await response.text();
        for (const id of open) document.getElementById(id)?.querySelector("details")?.setAttribute("open", "");
      }
    }, 250);
  }

  // Cut the stream now and hold off reconnecting for `ms` (a dropped connection, for tests
  // and for operators checking that the feed resumes).
  cut(ms = 0) {
    this.heldUntil = Date.now() + ms;
    this.controller?.abort();
  }

  show(state) { if (this.state) this.state.textContent = state; }
}

document.addEventListener("DOMContentLoaded", () => {
  document.querySelectorAll("select[name=deviceClass]").forEach(showProfileFor);
  const whatIf = document.getElementById("whatif");
  if (whatIf) window.consoleWhatIf = new WhatIf(whatIf);
  const list = document.getElementById("feed");
  if (list) {
    window.consoleFeed = new Feed(list);
    window.consoleFeed.run();
  }
});
