// /ui: every room the token may read, a page at a time, refreshed every few seconds.

import { get } from "./api.js";
import { count, empty, h, replace, section, table } from "./dom.js";

const REFRESH_MS = 5000;
const PAGE = 50;

function tasks(counts) {
  const parts = Object.entries(counts ?? {})
    .filter(([, n]) => n > 0)
    .map(([status, n]) => h("span", { class: `st st-${status}` }, `${status} ${count(n)}`));
  return parts.length ? parts : "—";
}

export function showOverview(main, trouble) {
  document.getElementById("crumb").textContent = "rooms";
  const status = document.getElementById("status");
  const pages = [null]; // the `after` of each page seen, for "previous"
  let at = 0;
  const body = h("div", {});
  const nav = h("p", { class: "pager" });
  replace(main, section("rooms", "Rooms", body, nav));

  async function load() {
    let data;
    try {
      data = await get("/v1/ops/rooms", { limit: PAGE, after: pages[at] });
    } catch (err) {
      trouble(err);
      return;
    }
    status.textContent = `refreshed ${new Date().toLocaleTimeString()}`;
    status.className = "live-on";
    const rows = data.rooms.map((r) =>
      h(
        "tr",
        { "data-room": r.room, class: r.stuck > 0 ? "bad" : "" },
        h("td", {}, h("a", { href: `/ui/rooms/${encodeURIComponent(r.room)}` }, r.room)),
        h("td", { class: r.stuck > 0 ? "num alarm" : "num" }, count(r.stuck)),
        h("td", {}, tasks(r.tasks)),
        h("td", { class: "num" }, count(r.locks_held)),
        h("td", { class: "num" }, count(r.online)),
        h("td", { class: "num" }, count(r.last_seq)),
      ),
    );
    replace(
      body,
      rows.length
        ? table(["room", "stuck", "tasks", "locks held", "online", "last seq"], rows)
        : empty("No rooms this token may read."),
    );
    const prev = h("button", { type: "button", disabled: at === 0, onclick: () => { at -= 1; load(); } }, "← previous");
    const next = h(
      "button",
      {
        type: "button",
        disabled: data.next_after === null,
        onclick: () => {
          pages[at + 1] = data.next_after;
          at += 1;
          load();
        },
      },
      "next →",
    );
    replace(nav, prev, ` page ${at + 1} `, next);
  }

  load();
  const timer = setInterval(load, REFRESH_MS);
  return () => clearInterval(timer);
}
