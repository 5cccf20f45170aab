// The status page: polls /queue, /accounts and /mailboxes, follows /events,
// searches.
// Data is only ever rendered as text (textContent / append of strings),
// never as HTML. The token comes from the URL fragment (#token=..., never
// sent to a server) or the form, and is kept in this tab's sessionStorage.
"use strict";

(() => {
  const STORE = "nexarch-events.auth";
  const REFRESH_MS = 5000;
  const RECONNECT_MS = 3000;
  const FEED_MAX = 200;

  const $ = (id) => document.getElementById(id);
  let auth = null;          // {token, tenant}
  let lastEventId = null;   // resume point of /events
  let stream = null;        // AbortController of the running /events request
  let generation = 0;       // bumped to stop a running follow() loop
  let timer = null;
  let refreshSoon = null;

  // -- token -----------------------------------------------------------------

  function takeFragment() {
    const params = new URLSearchParams(location.hash.slice(1));
    const token = params.get("token");
    if (token) {
      save({token, tenant: params.get("tenant") || ""});
      // Keep it out of the address bar and the history as well.
      history.replaceState(null, "", location.pathname + location.search);
    }
  }

  function save(value) { sessionStorage.setItem(STORE, JSON.stringify(value)); }

  function load() {
    try {
      const value = JSON.parse(sessionStorage.getItem(STORE) || "null");
      return value && typeof value.token === "string" && value.token ? value : null;
    } catch (_) {
      return null;
    }
  }

  function signOut(message) {
    sessionStorage.removeItem(STORE);
    auth = null;
    lastEventId = null;
    generation += 1;
    if (stream) stream.abort();
    clearInterval(timer);
    $("main").hidden = true;
    $("forget").hidden = true;
    $("login").hidden = false;
    $("login-error").textContent = message || "";
    setStreamState("off");
  }

  // -- API -------------------------------------------------------------------

  class Unauthorized extends Error {}

  function url(path, params) {
    const query = new URLSearchParams();
    for (const [key, value] of Object.entries(params || {})) {
      if (value !== undefined && value !== null && value !== "") query.set(key, String(value));
    }
    if (auth.tenant) query.set("tenant", auth.tenant);
    const text = query.toString();
    return text ? `${path}?${text}` : path;
  }

  async function api(method, path, params) {
    const response = await fetch(url(path, params), {
      method, cache: "no-store", headers: {Authorization: `Bearer ${auth.token}`},
    });
    let body = null;
    try { body = await response.json(); } catch (_) { body = null; }
    const message = body && typeof body.error === "string" ? body.error
      : `${method} ${path} answered HTTP ${response.status}`;
    if (response.status === 401) {
      signOut(`The server refused the token: ${message}`);
      throw new Unauthorized(message);
    }
    if (!response.ok) throw new Error(message);
    return body;
  }

  // -- rendering helpers -------------------------------------------------------

  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(props || {})) {
      if (key.startsWith("data-")) node.setAttribute(key, String(value));
      else node[key] = value;
    }
    node.append(...children.filter((c) => c !== null && c !== undefined).map(
      (c) => (typeof c === "string" || typeof c === "number" ? String(c) : c)));
    return node;
  }

  function duration(seconds) {
    if (seconds === null || seconds === undefined) return "–";
    if (seconds < 1) return `${Math.round(seconds * 1000)} ms`;
    if (seconds < 120) return `${seconds.toFixed(1)} s`;
    if (seconds < 7200) return `${Math.round(seconds / 60)} min`;
    if (seconds < 172800) return `${Math.round(seconds / 3600)} h`;
    return `${Math.round(seconds / 86400)} d`;
  }

  function when(iso) { return iso ? new Date(iso).toLocaleString() : "never"; }

  function ms(value) {
    if (value === null || value === undefined) return "–";
    return value < 10 ? value.toFixed(1) : String(Math.round(value));
  }

  // The API's snippets are escaped text with <mark> around matches: rebuild
  // them as text nodes and <mark> elements instead of parsing HTML.
  function snippet(html) {
    const out = el("p", {className: "hit-snippet"});
    let mark = null;
    for (const part of String(html).split(/(<mark>|<\/mark>)/)) {
      if (part === "<mark>") { mark = el("mark"); out.append(mark); continue; }
      if (part === "</mark>") { mark = null; continue; }
      (mark || out).append(unescape(part));
    }
    return out;
  }

  function unescape(text) {
    const named = {lt: "<", gt: ">", quot: "\"", "#x27": "'", "#39": "'", amp: "&"};
    return text.replace(/&(lt|gt|quot|#x27|#39|amp);/g, (_, name) => named[name]);
  }

  // -- queue and mailboxes -----------------------------------------------------

  async function refresh() {
    if (!auth) return;
    try {
      const q = await api("GET", "/queue");
      $("scope").textContent = q.tenant ? `tenant ${q.tenant}` : "all tenants";
      for (const status of ["pending", "processing", "succeeded", "failed"]) {
        $(`q-${status}`).textContent = String(q.counts[status]);
      }
      $("q-age").textContent = duration(q.oldest_ready_age_s);
      $("q-throughput").textContent = String(q.succeeded_last_minute);
      const l = q.wake_latency_ms;
      $("q-latency").textContent = `${ms(l.p50)} / ${ms(l.p90)} / ${ms(l.p99)} ms`;
      $("queue-error").textContent = "";
    } catch (err) {
      if (!(err instanceof Unauthorized)) $("queue-error").textContent = err.message;
    }
    try {
      const a = await api("GET", "/accounts");
      $("account-rows").replaceChildren(...a.accounts.flatMap(accountRows));
      $("account-error").textContent = a.accounts.length ? "" : "No accounts registered.";
    } catch (err) {
      if (!(err instanceof Unauthorized)) $("account-error").textContent = err.message;
    }
    try {
      const m = await api("GET", "/mailboxes");
      $("mailbox-rows").replaceChildren(...m.mailboxes.map(mailboxRow));
      $("mailbox-error").textContent = m.mailboxes.length ? "" : "No mailboxes registered.";
    } catch (err) {
      if (!(err instanceof Unauthorized)) $("mailbox-error").textContent = err.message;
    }
  }

  // A "Sync now" button: POST to path, then say how it went (as text).
  function syncButton(path, label) {
    const button = el("button", {type: "button", className: "quiet", title: label}, "Sync now");
    button.addEventListener("click", async () => {
      button.disabled = true;
      try {
        await api("POST", path);
        button.textContent = "requested";
      } catch (err) {
        button.textContent = "failed";
        button.title = err.message;
      }
    });
    return button;
  }

  const STATE_CLASS = {
    ok: "ok", "not synced yet": "warning", paused: "warning", warning: "warning",
    gone: "muted", error: "error", "discovery failed": "error", "not discovered yet": "warning",
  };

  function lagText(pending, since) {
    if (pending === null && (since === null || since === undefined)) return "–";
    return `${pending === null ? "–" : `${pending} msg`} · ${duration(since)}`;
  }

  // One row for the account, then one per folder (every value as text).
  function accountRows(a) {
    let detail = a.state;
    if (a.last_discovery_error) detail += `: ${a.last_discovery_error}`;
    const live = a.folders.filter((f) => f.state !== "gone").length;
    const head = el("tr", {className: "account", "data-account-id": a.id},
      el("td", {}, el("span", {className: "account-name"}, a.name),
         el("div", {className: "muted"}, `${a.tenant} · ${a.auth_method} · ${live} folder(s)`)),
      el("td", {}, `${a.host}:${a.port}`,
         el("div", {className: "muted"}, `discovered ${when(a.last_discovery_at)}`)),
      el("td", {className: `state-${STATE_CLASS[a.state] || "warning"}`}, detail),
      el("td", {}, String(a.folders.reduce((n, f) => n + (f.imported_total || 0), 0))),
      el("td", {}, lagText(a.pending_messages, a.since_success_s)),
      el("td", {}, ""),
      el("td", {}, syncButton(`/accounts/${a.id}/sync`, `every folder of ${a.name}`)));
    return [head, ...a.folders.map((f) => folderRow(a, f))];
  }

  function folderRow(a, f) {
    let detail = f.state;
    if (f.last_error) detail += `: ${f.last_error}`;
    else if (f.warning) detail += `: ${f.warning}`;
    if (f.failures) detail += ` (${f.failures} message(s) failing)`;
    if (f.idle_status) detail += ` — ${f.idle_status}`;
    const counts = `${f.imported_total ?? 0} / ${f.server_exists === null ? "–" : f.server_exists}`;
    return el("tr", {className: "folder", "data-mailbox-id": f.id, "data-account-id": a.id},
      el("td", {}, el("span", {className: "folder-name"}, f.folder),
         el("div", {className: "muted"}, f.name)),
      el("td", {}, ""),
      el("td", {className: `state-${STATE_CLASS[f.state] || "warning"}`}, detail),
      el("td", {}, counts),
      el("td", {}, lagText(f.pending_messages, f.since_success_s)),
      el("td", {}, when(f.last_success_at)),
      el("td", {}, f.state === "gone" ? null
        : syncButton(`/mailboxes/${f.id}/sync`, `folder ${f.folder}`)));
  }

  function mailboxRow(m) {
    let state = "ok";
    let detail = "ok";
    if (m.last_error) { state = "error"; detail = m.last_error; }
    else if (m.warning) { state = "warning"; detail = m.warning; }
    else if (!m.last_success_at) {
      state = "warning";
      detail = m.last_synced_uid ? `first sync not finished (imported up to UID ${m.last_synced_uid})`
                                 : "not synced yet";
    }
    if (m.failures) detail += ` (${m.failures} message(s) failing)`;
    if (m.idle_status) detail += ` — ${m.idle_status}`;
    const lag = m.pending_messages === null ? "–" : `${m.pending_messages} msg`;
    const sync = el("button", {type: "button", className: "quiet"}, "Sync now");
    sync.addEventListener("click", async () => {
      sync.disabled = true;
      try {
        await api("POST", `/mailboxes/${m.id}/sync`);
        sync.textContent = "requested";
      } catch (err) {
        sync.textContent = "failed";
        sync.title = err.message;
      }
    });
    return el("tr", {"data-mailbox-id": m.id},
      el("td", {}, el("span", {className: "mailbox-name"}, m.name),
         el("div", {className: "muted"}, m.tenant)),
      el("td", {}, `${m.host}:${m.port}`, el("div", {className: "muted"}, m.folder)),
      el("td", {className: `state-${state}`}, detail),
      el("td", {}, String(m.imported_total ?? 0)),
      el("td", {}, lag, el("div", {className: "muted"}, duration(m.since_success_s))),
      el("td", {}, when(m.last_success_at)),
      el("td", {}, sync));
  }

  // -- search ----------------------------------------------------------------

  async function search(event) {
    event.preventDefault();
    const q = $("q").value;
    $("search-summary").textContent = "searching…";
    try {
      const result = await api("GET", "/search", {q, limit: 20});
      const total = result.exact_total ? String(result.total) : `${result.total}+`;
      $("search-summary").textContent =
        `${total} match${result.total === 1 && result.exact_total ? "" : "es"}` +
        (result.total > result.hits.length ? `, first ${result.hits.length} shown` : "") +
        (result.ignored.length ? ` · ignored: ${result.ignored.join(" ")}` : "") +
        (result.warning ? ` · ${result.warning}` : "");
      $("hits").replaceChildren(...result.hits.map((hit) => el("li",
        {"data-archive-id": hit.archive_id},
        el("div", {className: "hit-subject"}, hit.subject || "(no subject)"),
        el("div", {className: "hit-meta"},
          `#${hit.archive_id} · ${hit.sender || "(no sender)"} · ${when(hit.sent_at)}` +
          (hit.mailboxes.length ? ` · ${hit.mailboxes.join(", ")}` : "")),
        snippet(hit.snippet))));
    } catch (err) {
      $("search-summary").textContent = err.message;
      $("hits").replaceChildren();
    }
  }

  // -- live events -----------------------------------------------------------

  function setStreamState(state) {
    const pill = $("stream-state");
    pill.dataset.state = state;
    pill.textContent = `events: ${state}`;
  }

  function describe(kind, d) {
    // Events name the folder (decoded) besides the mailbox it is archived as.
    const folder = d.folder && d.folder !== d.mailbox ? ` (folder ${d.folder})` : "";
    const where = d.mailbox ? `${d.tenant}/${d.mailbox}${folder}` : (d.tenant || "");
    switch (kind) {
      case "open": return d.resumed ? "stream resumed" : "stream opened";
      case "imported":
        return `message #${d.archive_id} in ${where}` + (d.uid ? ` (UID ${d.uid})` : "") +
          (d.duplicate ? ", seen before" : "");
      case "indexed": return `${where}: job(s) ${d.ids.join(", ")} done`;
      case "failed":
        return d.ids ? `${where}: job(s) ${d.ids.join(", ")} failed for good`
          : `${where} UID ${d.uid}: ${d.error || "import failed"}`;
      case "resync":
        return d.mailbox ? `${where}: UIDVALIDITY ${d.old_uidvalidity} → ${d.uidvalidity}`
          : (d.reason || "resynchronised");
      case "error": return d.error || "stream error";
      default: return JSON.stringify(d);
    }
  }

  function showEvent(kind, data) {
    const item = el("li", {"data-kind": kind},
      el("span", {className: "muted"}, new Date().toLocaleTimeString(), " "),
      el("span", {className: "kind"}, kind),
      describe(kind, data),
      data.replayed ? el("span", {className: "muted"}, " (replayed)") : null);
    if (typeof data.archive_id === "number") item.dataset.archiveId = String(data.archive_id);
    const list = $("events");
    list.prepend(item);
    while (list.children.length > FEED_MAX) list.lastElementChild.remove();
    if (kind !== "open" && refreshSoon === null) {
      refreshSoon = setTimeout(() => { refreshSoon = null; refresh(); }, 1000);
    }
  }

  // EventSource cannot send an Authorization header: read the stream with
  // fetch and parse the text/event-stream format here.
  async function follow(mine) {
    while (auth && mine === generation) {
      const controller = new AbortController();
      stream = controller;
      try {
        const headers = {Authorization: `Bearer ${auth.token}`, Accept: "text/event-stream"};
        if (lastEventId) headers["Last-Event-ID"] = lastEventId;
        const response = await fetch(url("/events"), {
          headers, cache: "no-store", signal: controller.signal});
        if (response.status === 401) { signOut("The server refused the token."); return; }
        if (!response.ok) {
          let message = `HTTP ${response.status}`;
          try { message = (await response.json()).error || message; } catch (_) { /* keep */ }
          throw new Error(message);
        }
        setStreamState("live");
        await readEvents(response.body);
      } catch (err) {
        if (controller.signal.aborted) return;
        showEvent("error", {error: `event stream: ${err.message}`});
      }
      if (!auth || mine !== generation) return;
      setStreamState("retrying");
      await new Promise((resolve) => setTimeout(resolve, RECONNECT_MS));
    }
  }

  async function readEvents(body) {
    const reader = body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const {value, done} = await reader.read();
      if (done) return;
      buffer += value;
      let end;
      while ((end = buffer.search(/\r?\n\r?\n/)) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end).replace(/^\r?\n\r?\n/, "");
        dispatch(block);
      }
    }
  }

  function dispatch(block) {
    let kind = "message";
    const data = [];
    for (const line of block.split(/\r?\n/)) {
      if (!line || line.startsWith(":")) continue;  // comments: keepalive
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      let value = colon < 0 ? "" : line.slice(colon + 1);
      if (value.startsWith(" ")) value = value.slice(1);
      if (field === "event") kind = value;
      else if (field === "data") data.push(value);
      else if (field === "id") lastEventId = value;
    }
    if (!data.length) return;
    try {
      showEvent(kind, JSON.parse(data.join("\n")));
    } catch (_) {
      /* not JSON: not ours */
    }
  }

  // -- start -----------------------------------------------------------------

  function start() {
    auth = load();
    if (!auth) { signOut(""); return; }
    $("login").hidden = true;
    $("main").hidden = false;
    $("forget").hidden = false;
    refresh();
    clearInterval(timer);
    timer = setInterval(refresh, REFRESH_MS);
    generation += 1;
    if (stream) stream.abort();
    follow(generation);
  }

  document.addEventListener("DOMContentLoaded", () => {
    $("login").addEventListener("submit", (event) => {
      event.preventDefault();
      save({token: $("token").value.trim(), tenant: $("tenant").value.trim()});
      $("token").value = "";
      start();
    });
    $("forget").addEventListener("click", () => signOut(""));
    $("search-form").addEventListener("submit", search);
    window.addEventListener("hashchange", () => { takeFragment(); start(); });
    takeFragment();
    start();
  });
})();
