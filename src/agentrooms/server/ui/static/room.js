// /ui/rooms/NAME: the room's first screen from one call (GET /v1/ops/rooms/NAME), live.
//
// Order on the page, most urgent first: the stuck list, a glance row (plan counts, locks,
// effects and dead letters, the hottest keys, the writer), then the plan (a page of 100
// tasks at a time, filterable by status), locks, presence, cursors, effects, documents and
// the event timeline (filterable by type and author). Each `change` on the room's stream
// refetches what is shown, debounced, one fetch at a time.

import { follow, get, roomPath } from "./api.js";
import { ago, clock, count, debounce, duration, empty, h, replace, section, table } from "./dom.js";

const STUCK_PER_KIND = 3; // rows of one kind shown before "+N more"
const DEBOUNCE_MS = 100;
const KINDS = {
  expired_lease: "expired lease, not reclaimed",
  failed_at_limit: "failed at its attempt limit",
  effect_unknown: "effect outcome unknown",
  waiter_waiting: "waiting for a lock",
  cursor_lagging: "cursor lagging",
};

// an error or reason as one line of text, whatever JSON it is
function said(value) {
  if (value === null || value === undefined) return "—";
  if (typeof value === "string") return value;
  if (typeof value === "object" && typeof value.message === "string") {
    return typeof value.type === "string" ? `${value.type}: ${value.message}` : value.message;
  }
  return JSON.stringify(value);
}

function kv(label, value, attrs = {}) {
  return h("div", { class: "kv", ...attrs }, h("span", { class: "k" }, label), h("span", { class: "v" }, value));
}

function stuckList(data, expanded, toggle) {
  const rows = [];
  const byKind = new Map();
  for (const item of data.stuck) {
    if (!byKind.has(item.kind)) byKind.set(item.kind, []);
    byKind.get(item.kind).push(item);
  }
  // kinds in the order of their most urgent item (the API's order), a few rows each
  for (const [kind, items] of byKind) {
    const shown = expanded.has(kind) ? items : items.slice(0, STUCK_PER_KIND);
    for (const item of shown) {
      rows.push(
        h(
          "tr",
          { class: "stuck-row", "data-kind": item.kind, "data-subject": item.subject },
          h("td", { class: "kind" }, KINDS[item.kind] ?? item.kind),
          h("td", { class: "subject" }, item.subject),
          h("td", { class: "detail" }, item.detail),
          h("td", { class: "num" }, item.since === null ? "—" : ago(item.since, data.now)),
        ),
      );
    }
    if (items.length > shown.length || expanded.has(kind)) {
      const more = items.length - shown.length;
      rows.push(
        h(
          "tr",
          { class: "more" },
          h(
            "td",
            { colspan: 4 },
            h(
              "button",
              { type: "button", onclick: () => toggle(kind) },
              more > 0 ? `+${count(more)} more: ${KINDS[kind] ?? kind}` : "show fewer",
            ),
          ),
        ),
      );
    }
  }
  const title = data.stuck.length ? `Stuck (${count(data.stuck.length)})` : "Stuck";
  return section(
    "stuck",
    title,
    rows.length
      ? table(["what", "subject", "detail", "since"], rows, { class: "stuck" })
      : h("p", { class: "ok", id: "nothing-stuck" }, "Nothing is stuck."),
  );
}

function glance(data) {
  const counts = data.plan.counts ?? {};
  const plan = h(
    "div",
    { class: "tile", id: "glance-plan" },
    h("h3", {}, `Plan: ${count(data.plan.total)} tasks`),
    Object.entries(counts)
      .filter(([, n]) => n > 0)
      .map(([status, n]) => kv(status, count(n), { class: `kv st-${status}` })),
  );
  const held = data.locks.filter((l) => l.holder !== null);
  const waiting = data.locks.reduce((n, l) => n + l.waiters.length, 0);
  const longest = data.locks.flatMap((l) => l.waiters.map((w) => w.waited));
  const locks = h(
    "div",
    { class: "tile", id: "glance-locks" },
    h("h3", {}, "Locks"),
    kv("held", count(held.length)),
    kv("waiters", count(waiting), { class: waiting ? "kv warn" : "kv" }),
    kv("longest wait", longest.length ? duration(Math.max(...longest)) : "—"),
  );
  const dead = data.effects.dead_letters;
  const effects = h(
    "div",
    { class: "tile", id: "glance-effects" },
    h("h3", {}, "Effects"),
    Object.entries(data.effects.counts ?? {})
      .filter(([, n]) => n > 0)
      .map(([state, n]) => kv(state, count(n), { class: `kv ef-${state}` })),
    kv("dead letters", count(dead.length), { class: dead.length ? "kv alarm" : "kv", id: "dead-count" }),
    dead.slice(0, 2).map((e) =>
      h("div", { class: "line alarm", "data-dead-letter": e.id, title: said(e.error) }, `✉ ${e.id}: ${said(e.error)}`),
    ),
  );
  const hot = h(
    "div",
    { class: "tile", id: "glance-contention" },
    h("h3", {}, "Hottest keys"),
    data.contention.length
      ? data.contention.slice(0, 3).map((c, i) =>
          kv(c.prefix, `${count(c.conflicts)} conflicts`, { class: i === 0 ? "kv warn" : "kv", "data-hot": c.prefix }),
        )
      : empty("no conflicts"),
  );
  const writer = h(
    "div",
    { class: "tile", id: "glance-writer" },
    h("h3", {}, "Writer"),
    kv("queued", count(data.writer.queued)),
    kv("dead letters", count(data.writer.dead_letters), { class: data.writer.dead_letters ? "kv alarm" : "kv" }),
    kv("online agents", count(data.presence.filter((p) => p.online).length)),
    kv("max cursor lag", count(Math.max(0, ...data.cursors.map((c) => c.lag)))),
  );
  return h("div", { class: "glance", id: "glance" }, plan, locks, effects, hot, writer);
}

function taskRows(tasks) {
  return tasks.map((t) =>
    h(
      "tr",
      { "data-task": t.id, class: `state-${t.state.replace(/[^a-z]+/g, "-")}` },
      h("td", { class: "mono" }, t.id),
      h("td", {}, t.status),
      h("td", { class: "state" }, t.state),
      h("td", {}, t.owner ?? "—"),
      h("td", { class: "num" }, duration(t.lease_remaining)),
      h("td", { class: "num" }, t.fence ?? "—"),
      h("td", { class: "num" }, t.attempts),
      h("td", { class: "deps" }, t.deps.length ? t.deps.join(", ") : "—"),
    ),
  );
}

function locksPanel(data) {
  const rows = data.locks.map((l) =>
    h(
      "tr",
      { "data-lock": l.name, class: l.waiters.length ? "warn" : "" },
      h("td", { class: "mono" }, l.name),
      h("td", {}, l.holder ?? "free"),
      h("td", { class: "num" }, ago(l.since, data.now)),
      h("td", { class: "num" }, duration(l.remaining)),
      h("td", { class: "num" }, l.fence),
      h(
        "td",
        {},
        l.waiters.length
          ? l.waiters.map((w) => h("span", { class: "waiter" }, `${w.owner} (${duration(w.waited)})`))
          : "—",
      ),
    ),
  );
  return section(
    "locks",
    `Locks (${count(data.locks.length)})`,
    rows.length ? table(["lock", "holder", "since", "remaining", "fence", "waiters (waited)"], rows) : empty("No locks."),
  );
}

function presencePanel(data) {
  const rows = data.presence.map((p) =>
    h(
      "tr",
      { "data-agent": p.agent, class: p.online ? "" : "dim" },
      h("td", {}, p.agent),
      h("td", {}, p.online ? "● online" : "○ away"),
      h("td", { class: "num" }, ago(p.last_seen, data.now)),
    ),
  );
  return section("presence", "Presence", rows.length ? table(["agent", "", "last seen"], rows) : empty("Nobody."));
}

function cursorsPanel(data) {
  const rows = [...data.cursors]
    .sort((a, b) => b.lag - a.lag)
    .map((c) =>
      h(
        "tr",
        { "data-cursor": c.agent, class: c.lag > 0 ? "" : "dim" },
        h("td", {}, c.agent),
        h("td", { class: "num" }, count(c.position)),
        h("td", { class: "num" }, count(c.lag)),
      ),
    );
  return section("cursors", "Cursors", rows.length ? table(["agent", "position", "lag (events)"], rows) : empty("No cursors."));
}

function effectRows(kind, effects, now) {
  return effects.map((e) =>
    h(
      "tr",
      { "data-effect": e.id, "data-effect-kind": kind },
      h("td", {}, kind),
      h("td", { class: "mono" }, e.id),
      h("td", {}, e.state),
      h("td", { class: "num" }, ago(e.since, now)),
      h("td", { class: "num" }, e.attempts),
      h("td", { class: "detail" }, said(e.error)),
    ),
  );
}

function effectsPanel(data) {
  const rows = [
    ...effectRows("unknown", data.effects.unknown, data.now),
    ...effectRows("failed", data.effects.failed, data.now),
    ...effectRows("dead letter", data.effects.dead_letters, data.now),
  ];
  return section(
    "effects",
    "Effects needing attention",
    rows.length ? table(["", "effect", "state", "since", "attempts", "error"], rows) : empty("None unknown, failed or dead."),
  );
}

function documentsPanel(data) {
  const rows = data.documents.map((d) =>
    h("tr", { "data-doc": d.name }, h("td", { class: "mono" }, d.name), h("td", { class: "num" }, d.version), h("td", {}, d.last_writer ?? "—")),
  );
  return section("documents", "Documents", rows.length ? table(["document", "version", "last writer"], rows) : empty("No documents."));
}

function eventRows(events) {
  return events.map((e) =>
    h(
      "tr",
      { "data-seq": e.seq, "data-type": e.type },
      h("td", { class: "num" }, e.seq),
      h("td", { class: "mono" }, clock(e.time)),
      h("td", {}, e.type),
      h("td", {}, e.author ?? "—"),
      h("td", { class: "data" }, JSON.stringify(e.data)?.slice(0, 300) ?? ""),
    ),
  );
}

export function showRoom(main, room, trouble) {
  document.getElementById("crumb").textContent = `› ${room}`;
  document.title = `${room} · agentrooms`;
  const status = document.getElementById("status");
  const expanded = new Set();
  const plan = { status: "", marks: [null], at: 0, page: null };
  const log = { type: "", author: "", marks: [null], at: 0, page: null };
  let data = null;

  // containers that survive refetches (filters keep their focus and text)
  const top = h("div", { id: "first" });
  const planBody = h("div", { class: "scroll", id: "plan-rows" });
  const planNav = h("p", { class: "pager" });
  const statusFilter = h("select", { id: "plan-status", onchange: () => { plan.status = statusFilter.value; plan.marks = [null]; plan.at = 0; refresh(); } });
  const planPanel = section("plan", "Plan", h("p", { class: "filters" }, h("label", {}, "status ", statusFilter)), planBody, planNav);
  const side = h("div", { class: "side" });
  const rest = h("div", { id: "rest" });
  const typeFilter = h("input", { id: "event-type", placeholder: "type", list: "event-types", size: 16 });
  const authorFilter = h("input", { id: "event-author", placeholder: "author", list: "event-authors", size: 16 });
  const typeList = h("datalist", { id: "event-types" });
  const authorList = h("datalist", { id: "event-authors" });
  const eventsBody = h("div", { class: "scroll", id: "event-rows" });
  const eventsNav = h("p", { class: "pager" });
  const onFilter = debounce(() => {
    log.type = typeFilter.value.trim();
    log.author = authorFilter.value.trim();
    log.marks = [null];
    log.at = 0;
    refresh();
  }, 300);
  typeFilter.addEventListener("input", onFilter);
  authorFilter.addEventListener("input", onFilter);
  const eventsPanel = section(
    "events",
    "Events",
    h("p", { class: "filters" }, h("label", {}, "type ", typeFilter), " ", h("label", {}, "author ", authorFilter), typeList, authorList),
    eventsBody,
    eventsNav,
  );
  replace(main, top, h("div", { class: "columns" }, planPanel, side), rest, eventsPanel);

  // previous / next over pages whose starting marks (after / before) are state.marks
  function pager(nav, state, next, labels) {
    const prev = h("button", { type: "button", disabled: state.at === 0, onclick: () => { state.at -= 1; refresh(); } }, labels[0]);
    const more = h(
      "button",
      {
        type: "button",
        disabled: next === null,
        onclick: () => {
          state.marks[state.at + 1] = next;
          state.at += 1;
          refresh();
        },
      },
      labels[1],
    );
    replace(nav, prev, ` page ${state.at + 1} `, more);
  }

  function render() {
    replace(top, stuckList(data, expanded, (kind) => { if (expanded.has(kind)) expanded.delete(kind); else expanded.add(kind); render(); }), glance(data));
    // the plan: the first screen's page unless a filter or a later page is chosen
    const counts = data.plan.counts ?? {};
    const chosen = statusFilter.value;
    replace(
      statusFilter,
      h("option", { value: "" }, `all (${count(data.plan.total)})`),
      Object.entries(counts).map(([s, n]) => h("option", { value: s, selected: s === chosen }, `${s} (${count(n)})`)),
    );
    const page = plan.page ?? data.plan;
    replace(
      planBody,
      page.tasks.length
        ? table(["task", "status", "state", "owner", "lease left", "fence", "attempts", "deps"], taskRows(page.tasks), { class: "plan" })
        : empty("No tasks."),
    );
    pager(planNav, plan, page.next_after, ["← previous", "next →"]);
    replace(side, locksPanel(data), presencePanel(data), cursorsPanel(data));
    replace(rest, h("div", { class: "columns" }, effectsPanel(data), documentsPanel(data)));
    const events = log.page ?? { events: data.events, next_before: data.events.length >= 50 ? data.events.at(-1).seq : null };
    replace(eventsBody, events.events.length ? table(["seq", "time (store)", "type", "author", "data"], eventRows(events.events), { class: "events" }) : empty("No events."));
    pager(eventsNav, log, events.next_before, ["← newer", "older →"]);
    replace(typeList, [...new Set(data.events.map((e) => e.type))].map((t) => h("option", { value: t })));
    replace(authorList, [...new Set(data.events.map((e) => e.author).filter(Boolean))].map((a) => h("option", { value: a })));
    document.getElementById("who").textContent = `last seq ${count(data.last_seq)} · store time ${clock(data.now)}`;
  }

  let running = false;
  let again = false;
  async function refresh() {
    if (running) {
      again = true;
      return;
    }
    running = true;
    try {
      const base = roomPath(room);
      const planWanted = plan.status !== "" || plan.at > 0;
      const logWanted = log.type !== "" || log.author !== "" || log.at > 0;
      const [first, planPage, logPage] = await Promise.all([
        get(base),
        planWanted ? get(`${base}/tasks`, { limit: 100, after: plan.marks[plan.at], status: plan.status }) : null,
        logWanted ? get(`${base}/events`, { limit: 50, before: log.marks[log.at], type: log.type, author: log.author }) : null,
      ]);
      data = first;
      plan.page = planPage;
      log.page = logPage;
      render();
    } catch (err) {
      trouble(err);
    } finally {
      running = false;
      if (again) {
        again = false;
        refresh();
      }
    }
  }

  const onChange = debounce(refresh, DEBOUNCE_MS);
  refresh();
  return follow(room, onChange, (state, message) => {
    status.textContent = state === "live" ? "● live" : state === "refused" ? `not live: ${message}` : state;
    status.className = state === "live" ? "live-on" : "live-off";
    status.dataset.state = state;
  });
}
