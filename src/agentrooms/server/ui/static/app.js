// The dashboard's entry: the token, the route (/ui or /ui/rooms/NAME), and the login form.

import { ApiError, adoptFragment, setToken, token } from "./api.js";
import { replace, h } from "./dom.js";
import { showOverview } from "./overview.js";
import { showRoom } from "./room.js";

const main = () => document.getElementById("main");
let stop = null;

// What the page does with an error of the API: ask for a token, or say what is wrong.
export function trouble(err) {
  const login = document.getElementById("login");
  const why = document.getElementById("login-why");
  if (err instanceof ApiError && (err.status === 401 || err.status === 403)) {
    if (stop) stop();
    login.hidden = false;
    why.textContent =
      err.status === 403
        ? `This token may not read the operator view (${err.message}). Use a token with the ops:read scope.`
        : `This dashboard needs a token with the ops:read scope (${err.message}).`;
    replace(main());
    document.getElementById("login-token").focus();
    return;
  }
  if (err instanceof ApiError && err.status === 404) {
    if (stop) stop();
    replace(main(), h("p", { class: "error", id: "absent" }, `Not found: ${err.message}`));
    return;
  }
  const status = document.getElementById("status");
  status.textContent = `error: ${err.message}`;
  status.className = "live-off";
}

function start() {
  adoptFragment();
  const forget = document.getElementById("forget");
  forget.hidden = !token();
  forget.addEventListener("click", () => {
    setToken(null);
    location.reload();
  });
  document.getElementById("login").addEventListener("submit", (e) => {
    e.preventDefault();
    setToken(document.getElementById("login-token").value);
    location.reload();
  });
  const path = decodeURIComponent(location.pathname);
  const match = path.match(/^\/ui\/rooms\/([^/]+)$/);
  stop = match ? showRoom(main(), match[1], trouble) : showOverview(main(), trouble);
}

start();
