// The operator API from the page: the bearer token (sessionStorage only), JSON reads, and
// the room's live stream through a single-use stream ticket (EventSource sends no headers).

const KEY = "agentrooms.token";

export class ApiError extends Error {
  constructor(status, body) {
    super(body?.error?.message ?? `HTTP ${status}`);
    this.status = status;
    this.body = body;
  }
}

export function token() {
  return sessionStorage.getItem(KEY);
}

export function setToken(value) {
  if (value) sessionStorage.setItem(KEY, value.trim());
  else sessionStorage.removeItem(KEY);
}

// A token handed over in the URL's fragment (#token=...) is taken into sessionStorage
// and removed from the address bar. The fragment never reaches a server; the query
// string would (and the server revokes any token it finds there).
export function adoptFragment() {
  const match = location.hash.match(/^#token=([^&]+)/);
  if (!match) return;
  setToken(decodeURIComponent(match[1]));
  history.replaceState(null, "", location.pathname + location.search);
}

function headers() {
  const out = { Accept: "application/json" };
  const t = token();
  if (t) out.Authorization = `Bearer ${t}`;
  return out;
}

async function answer(response) {
  if (response.ok) return response.json();
  let body = null;
  try {
    body = await response.json();
  } catch {
    body = null;
  }
  throw new ApiError(response.status, body);
}

export async function get(path, params = {}) {
  const url = new URL(path, location.origin);
  for (const [name, value] of Object.entries(params)) {
    if (value !== null && value !== undefined && value !== "") url.searchParams.set(name, value);
  }
  return answer(await fetch(url, { headers: headers(), cache: "no-store" }));
}

export async function post(path) {
  return answer(await fetch(new URL(path, location.origin), { method: "POST", headers: headers() }));
}

export const roomPath = (room) => `/v1/ops/rooms/${encodeURIComponent(room)}`;

// Follow the room's stream: onChange(lastSeq) on each `change` event (and with null after
// a reconnect, since changes may have been missed); onState("live" | "reconnecting" |
// "offline" | "refused", message). Every connection opens with a fresh single-use ticket
// (also in dev mode: asking for it is where a full pool of dashboard streams answers 429
// with its reason, which an EventSource never sees); a dropped connection is never
// retried with a used one, and a refused one is retried slowly. Returns a function that
// stops.
export function follow(room, onChange, onState) {
  let source = null;
  let stopped = false;
  let delay = 250;
  let timer = null;
  let opened = false;

  const retry = (state = "reconnecting", message = "") => {
    if (stopped) return;
    onState(state, message);
    timer = setTimeout(connect, state === "refused" ? 8000 : delay);
    delay = Math.min(delay * 2, 8000);
  };

  async function connect() {
    let url;
    try {
      url = (await post(`${roomPath(room)}/stream-tickets`)).url;
    } catch (err) {
      if (err instanceof ApiError && err.status === 429) {
        retry("refused", err.message);
        return;
      }
      if (err instanceof ApiError && err.status < 500) {
        onState("offline", err.message);
        return;
      }
      retry();
      return;
    }
    if (stopped) return;
    source = new EventSource(url);
    source.addEventListener("open", () => {
      delay = 250;
      onState("live");
      if (opened) onChange(null);
      opened = true;
    });
    source.addEventListener("change", (e) => {
      let seq = null;
      try {
        seq = JSON.parse(e.data).last_seq ?? null;
      } catch {
        seq = null;
      }
      onChange(seq);
    });
    source.addEventListener("error", () => {
      source.close();
      retry();
    });
  }

  connect();
  return () => {
    stopped = true;
    clearTimeout(timer);
    if (source) source.close();
  };
}
