// Small DOM helpers. Everything from the API goes in as text (textContent), never as HTML.

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith("on")) el.addEventListener(name.slice(2), value);
    else if (name === "class") el.className = value;
    else el.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

export function replace(el, ...children) {
  el.replaceChildren(...children.flat().filter((c) => c !== null && c !== undefined));
  return el;
}

// A duration in seconds as "2h 03m", "4m 05s", "12.3s"; null as an em dash.
export function duration(s) {
  if (s === null || s === undefined) return "—";
  const neg = s < 0;
  let v = Math.abs(s);
  let out;
  if (v < 10) out = `${v.toFixed(1)}s`;
  else if (v < 60) out = `${Math.floor(v)}s`;
  else if (v < 3600) out = `${Math.floor(v / 60)}m ${String(Math.floor(v % 60)).padStart(2, "0")}s`;
  else if (v < 86400) out = `${Math.floor(v / 3600)}h ${String(Math.floor((v % 3600) / 60)).padStart(2, "0")}m`;
  else out = `${Math.floor(v / 86400)}d ${Math.floor((v % 86400) / 3600)}h`;
  return neg ? `-${out}` : out;
}

// How long ago store-clock time t was, judged by the store-clock time now.
export function ago(t, now) {
  return t === null || t === undefined ? "—" : `${duration(now - t)} ago`;
}

export function clock(t) {
  if (t === null || t === undefined) return "—";
  return new Date(t * 1000).toISOString().replace("T", " ").slice(0, 19) + "Z";
}

export function count(n) {
  return Number(n).toLocaleString("en-US");
}

export function debounce(fn, ms) {
  let timer = null;
  return (...args) => {
    clearTimeout(timer);
    timer = setTimeout(() => fn(...args), ms);
  };
}

export function section(id, title, ...body) {
  return h("section", { id, class: "panel" }, h("h2", {}, title), ...body);
}

export function table(headers, rows, attrs = {}) {
  return h(
    "table",
    attrs,
    h("thead", {}, h("tr", {}, headers.map((x) => h("th", {}, x)))),
    h("tbody", {}, rows),
  );
}

export function empty(text) {
  return h("p", { class: "empty" }, text);
}
