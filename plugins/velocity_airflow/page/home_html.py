"""The Velocity page in the Airflow UI, rendered from plain data (pure: no Airflow, no I/O).

``velocity_airflow.page.home`` gathers the data (rules, alerts, health, lookups) and hands it to
``render_page``; everything shown is escaped here. Forms post back to the page's own app;
the Airflow UI shows it in a sandboxed iframe that blocks ``confirm()``, so a delete is
confirmed by a second button inside a ``<details>`` instead.

A rule change in flight is shown: a form that changes something carries the words for it
(``data-progress``); a few lines of script show them at the top, disable the change
buttons and post the form with ``fetch``. A click that changes one thing (assign, close,
reopen, pause, activate, delete, an outcome; the queue's filter, orders and pages; the
window lookup: ``data-in-place``) gets back the outcome and the parts of the page it
changed (a case's facts, a rule's row, the queue), drawn in place (``data-part``): the
page stays, its live counter counting. Any other change's page, with the outcome,
replaces this one. Without script the forms post as plain forms and the page comes back.

Every form that posts carries the page's token (``csrf_token``, ``PageData.csrf``: drawn
for the signed-in session by ``access.csrf_token``), and the page's ``<meta
name="csrf-token">`` holds it for the script, which sends it as ``X-CSRF-Token`` too: the
server refuses a post from the browser without it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from html import escape
from typing import Any

from velocity.analyst.alert_search import PAGE_SIZE, AlertFilter, Cursor, duration_text, key_text
from velocity.analyst.backfill_runs import BackfillRunView
from velocity.analyst.case_queue import CasePage
from velocity.analyst.reviews import Review, VersionPrecision
from velocity.analyst.rule_rates import RATE_MINUTES, WARN_SHARE, RuleRate
from velocity.analyst.shadow_compare import ShadowComparison
from velocity.domain.rules import Outcome, Rule, RuleState, rule_summary
from velocity_airflow.page import (
    alerts_html,
    backfills_html,
    cases_html,
    preview_html,
    review_html,
    shadow_html,
    values_html,
)
from velocity_airflow.page.values_html import (
    key_html,
    number_text,
    time_text,
    token_input,
    token_meta,
)

# How many alerts a page lists, newest first.
ALERTS_SHOWN = PAGE_SIZE

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1rem 1.5rem; color: #1a202c; }
h1 { font-size: 1.4rem; margin: 0 0 .5rem; } h2 { font-size: 1.1rem; margin: 1.5rem 0 .5rem; }
table { border-collapse: collapse; width: 100%; font-size: .9rem; }
th, td { text-align: left; padding: .3rem .5rem; border-bottom: 1px solid #e2e8f0; }
td { vertical-align: top; }
th { background: #f7fafc; } code, pre { font-size: .85rem; }
.ok { color: #276749; } .bad { color: #c53030; } .muted { color: #718096; }
.flash { padding: .5rem .75rem; border-radius: 4px; margin: .5rem 0; white-space: pre-wrap; }
.flash.ok { background: #f0fff4; border: 1px solid #9ae6b4; }
.flash.bad { background: #fff5f5; border: 1px solid #feb2b2; }
.flash.busy { background: #ebf8ff; border: 1px solid #90cdf4; }
.flash.busy::before { content: ""; display: inline-block; width: .8em; height: .8em;
  margin-right: .5em; border: 2px solid #3182ce; border-right-color: transparent;
  border-radius: 50%; animation: spin .8s linear infinite; vertical-align: -.1em; }
@keyframes spin { to { transform: rotate(360deg); } }
.state-ACTIVE { color: #276749; font-weight: 600; }
.state-PAUSE { color: #b7791f; font-weight: 600; }
form.inline { display: inline; } button { cursor: pointer; margin-right: .25rem; }
textarea { width: 100%; font-family: monospace; }
.health { display: flex; gap: 1.5rem; flex-wrap: wrap; }
.bars { display: inline-flex; align-items: flex-end; height: 1.4rem; gap: 2px;
  vertical-align: middle; border-bottom: 1px solid #cbd5e0; }
.bars .minute { display: inline-flex; align-items: flex-end; height: 100%; gap: 1px; }
.bars i { display: inline-block; width: 3px; min-height: 1px; }
.bars i.n { background: #3182ce; } .bars i.s { background: #d69e2e; }
label.choice { display: inline-block; margin-right: .8rem; font-size: .85rem; }
.outcome { font-size: .8rem; font-weight: 600; margin-right: .3rem; }
.outcome-ALERT { color: #4a5568; } .outcome-REVIEW { color: #b7791f; }
.outcome-BLOCK { color: #c53030; }
p.nav { margin: .2rem 0 .6rem; }
"""


# A change in flight: the words of the form (or button) that posted it at the top, the
# change buttons disabled, the post sent by fetch() so the page stays. A form marked
# data-in-place (assign, close, reopen, pause, activate, delete, an outcome) asks for
# what it changed (the header X-Velocity-In-Place): the server answers JSON, the outcome
# and the parts it redrew, each put in place of the page's element data-part="<name>",
# the focus kept on its field; a refusal (403, 409, a rule rejected) is said at the top
# and beside the button clicked. A GET form or link marked data-in-place="<url>" (the
# queue's filter, orders and pages, the window lookup) reads its part from that url with
# the page's URL parameters as they would be, and the page's URL then says them (history).
# Any other form: the page that comes back replaces this one. Should fetch fail, the form
# is posted as a plain form. The live feed goes on counting meanwhile.
_PROGRESS_SCRIPT = """
(function () {
  function busy(words) {
    var shown = document.getElementById("change-progress");
    if (shown) { shown.textContent = words; shown.hidden = !words; }
    document.querySelectorAll("form[data-progress] button").forEach(function (button) {
      button.disabled = !!words;
    });
  }
  function said(ok, text, form) {
    document.querySelectorAll('[data-testid="flash"], [data-testid="click-error"]')
      .forEach(function (old) { old.remove(); });
    if (!text) { return; }
    var top = document.createElement("div");
    top.className = "flash " + (ok ? "ok" : "bad");
    top.dataset.testid = "flash";
    top.textContent = text;
    var progress = document.getElementById("change-progress");
    if (progress) { progress.after(top); }
    if (ok || !form) { return; }
    var here = document.createElement("span");
    here.className = "bad";
    here.dataset.testid = "click-error";
    here.setAttribute("role", "alert");
    here.textContent = " " + text;
    form.appendChild(here);
  }
  function draw(parts) {
    var active = document.activeElement, again = null;
    if (active && active !== document.body) {
      again = active.dataset.testid ? '[data-testid="' + CSS.escape(active.dataset.testid) + '"]'
        : active.name ? '[name="' + CSS.escape(active.name) + '"]' : null;
    }
    Object.keys(parts).forEach(function (name) {
      document.querySelectorAll('[data-part="' + CSS.escape(name) + '"]').forEach(function (old) {
        if (parts[name]) { old.outerHTML = parts[name]; } else { old.remove(); }
      });
    });
    var found = again && !active.isConnected ? document.querySelector(again) : null;
    if (found) { found.focus(); }
    if (window.velocityAgo) { window.velocityAgo(); }
    if (window.velocityRefocus) { window.velocityRefocus(); }
  }
  function send(url, init, form, then) {
    // Where the click was, to say a refusal there: its form, else the part that held it.
    var action = form && form.getAttribute("action");
    var part = form && form.closest("[data-part]");
    var within = part ? '[data-part="' + CSS.escape(part.dataset.part) + '"]' : null;
    init.credentials = "same-origin";
    init.headers = Object.assign({"X-Velocity-In-Place": "1"}, init.headers);
    return fetch(url, init).then(function (reply) {
      return reply.json().then(function (answer) {
        var ok = reply.ok && answer.ok !== false;
        var detail = answer.detail;
        draw(answer.parts || {});
        if (form && !form.isConnected) {
          form = document.querySelector('form[action="' + CSS.escape(action) + '"]') ||
            (within && document.querySelector(within));
          if (form && form.tagName === "TR") { form = form.lastElementChild; }
        }
        said(ok, answer.text || (typeof detail === "string" ? detail
          : detail ? JSON.stringify(detail) : ""), form);
        if (then) { then(answer, ok); }
        document.dispatchEvent(new CustomEvent("velocity:drawn", {detail: answer}));
      }, function () {
        said(false, "no answer the page can read (" + reply.status + "): reload the page", form);
      });
    }, function (error) {
      said(false, "not sent (" + error.message + "): try again", form);
    }).then(function () { busy(""); });
  }
  // The page's URL parameters after a read in place: the URL, and what the page's forms
  // send back (hidden fields), say them; owned: the names it may have changed (all: null).
  function keep(params, owned, drawn) {
    var query = params.toString(), before = new URLSearchParams(location.search);
    history.pushState(null, "", location.pathname + (query ? "?" + query : ""));
    function mine(name) { return !owned || owned.indexOf(name) >= 0; }
    relink(before, params, drawn);
    document.querySelectorAll('form[method="get"]').forEach(function (form) {
      form.querySelectorAll('input[type="hidden"]').forEach(function (field) {
        if (mine(field.name)) { field.remove(); }
      });
      params.forEach(function (value, name) {
        if (mine(name) && !form.querySelector('[name="' + CSS.escape(name) + '"]')) {
          var field = document.createElement("input");
          field.type = "hidden"; field.name = name; field.value = value;
          form.appendChild(field);
        }
      });
    });
    document.querySelectorAll('input[type="hidden"][name="back"]').forEach(function (field) {
      var back = new URLSearchParams(field.value);
      Array.from(back.keys()).forEach(function (name) { if (mine(name)) { back.delete(name); } });
      params.forEach(function (value, name) { if (mine(name)) { back.set(name, value); } });
      field.value = back.toString();
    });
  }
  // A link drawn before a read in place (the alerts' paging, an explanation, the queue's
  // links when the alerts were read) carries the page's parameters as they were: each
  // parameter the read changed, where the link carried the old value, gets the new one;
  // a value of the link's own (its page, its alert) stays. Links in the parts just drawn
  // came with the read and are left alone.
  function relink(before, after, drawn) {
    var names = {};
    before.forEach(function (value, name) { names[name] = true; });
    after.forEach(function (value, name) { names[name] = true; });
    var changed = Object.keys(names).filter(function (name) {
      return before.getAll(name).join("&") !== after.getAll(name).join("&");
    });
    var fresh = (drawn || []).map(function (name) {
      return '[data-part="' + CSS.escape(name) + '"]';
    }).join(",");
    var base = location.pathname.replace(/[^/]*$/, "");
    document.querySelectorAll("a[href]").forEach(function (link) {
      var url = new URL(link.getAttribute("href"), location.href);
      if (url.origin !== location.origin || url.pathname.indexOf(base) !== 0) { return; }
      if (fresh && link.closest(fresh)) { return; }
      var moved = false;
      changed.forEach(function (name) {
        if (url.searchParams.get(name) !== before.get(name)) { return; }
        url.searchParams.delete(name);
        after.getAll(name).forEach(function (value) { url.searchParams.append(name, value); });
        moved = true;
      });
      if (moved) { link.setAttribute("href", url.pathname + url.search + url.hash); }
    });
  }
  function read(url, params, form, owned) {
    var query = params.toString();
    send(url + (query ? "?" + query : ""), {method: "GET"}, form, function (answer) {
      keep(params, owned, Object.keys(answer.parts || {}));
      if (answer.live) { document.body.dataset.live = answer.live; }
    });
  }
  window.addEventListener("popstate", function () { location.reload(); });
  document.addEventListener("click", function (event) {
    var link = event.target.closest ? event.target.closest("a[data-in-place]") : null;
    if (!link || event.button !== 0 || event.ctrlKey || event.metaKey || event.shiftKey) {
      return;
    }
    event.preventDefault();
    read(link.dataset.inPlace, new URL(link.href).searchParams, null, null);
  });
  document.addEventListener("submit", function (event) {
    var form = event.target, submitter = event.submitter;
    if (form.dataset.plain) { return; }
    if (form.method === "get") {
      if (!form.dataset.inPlace) { return; }
      event.preventDefault();
      var owned = (form.dataset.owns || "").split(" ");
      var params = new URLSearchParams(location.search);
      owned.forEach(function (name) { params.delete(name); });
      form.querySelectorAll('input:not([type="hidden"]), select').forEach(function (field) {
        if (field.name && field.value) { params.set(field.name, field.value); }
      });
      read(form.dataset.inPlace, params, form, owned);
      return;
    }
    var source = submitter && submitter.dataset.progress ? submitter : form;
    var words = source.dataset && source.dataset.progress;
    if (!words) { return; }
    event.preventDefault();
    var body = new FormData(form, submitter);
    // The page's token: in the form's field, and as a header (a form drawn by a live
    // update carries it too; the meta is the page's).
    var meta = document.querySelector('meta[name="csrf-token"]');
    var token = meta ? meta.content : "";
    if (token && !body.has("csrf_token")) { body.append("csrf_token", token); }
    // Back to this page's URL (its filters and pages) after the change.
    if (!body.has("back")) { body.append("back", location.search.replace(/^\\?/, "")); }
    // A button may post the form elsewhere (Preview: it saves nothing).
    var action = submitter && submitter.hasAttribute("formaction") ? submitter.formAction
      : form.action;
    var sent = {"X-Velocity-Sent": String(Math.round(performance.timeOrigin + performance.now()))};
    if (token) { sent["X-CSRF-Token"] = token; }
    busy(words);
    if (form.hasAttribute("data-in-place")) {
      send(action, {method: "POST", body: body, headers: sent}, form);
      return;
    }
    if (window.velocityLive) { window.velocityLive.close(); }
    var shown = document.querySelector('[data-testid="flash"]');
    if (shown) { shown.hidden = true; }
    fetch(action, {method: "POST", body: body, credentials: "same-origin", headers: sent})
      .then(function (reply) {
        return reply.text().then(function (html) {
          document.open();
          document.write(html);
          document.close();
          if (reply.redirected) { history.replaceState(null, "", reply.url); }
        });
      })
      .catch(function () {
        form.dataset.plain = "1";
        form.action = action;
        if (token && !form.querySelector('input[name="csrf_token"]')) {
          var field = document.createElement("input");
          field.type = "hidden"; field.name = "csrf_token"; field.value = token;
          form.appendChild(field);
        }
        if (submitter && submitter.name) {
          var kept = document.createElement("input");
          kept.type = "hidden"; kept.name = submitter.name; kept.value = submitter.value;
          form.appendChild(kept);
        }
        form.submit();
      });
  });
})();
"""

# Each click on a link or button (and each keyboard move that posts) leaves its moment
# (the browser's clock: performance.timeOrigin + the event's timeStamp) in a short-lived
# cookie, which the next request to the page's app carries: the server notes how long
# after the click it received the request (``velocity_airflow.page.clicks``' ClickTiming).
_CLICK_SCRIPT = """
(function () {
  function mark(what, event) {
    var at = performance.timeOrigin + (event ? event.timeStamp : performance.now());
    var id = Math.random().toString(36).slice(2, 10);
    var name = String(what || "click").replace(/[^A-Za-z0-9_-]/g, "").slice(0, 40);
    document.cookie = "velocity_click=" + id + "." + Math.round(at) + "." + name +
      "; path=/velocity; max-age=10; samesite=lax";
  }
  window.velocityClicked = mark;
  document.addEventListener("click", function (event) {
    var target = event.target.closest ? event.target.closest("a[href], button") : null;
    if (target) { mark(target.dataset.testid || target.tagName.toLowerCase(), event); }
  }, true);
})();
"""

# The page's live feed (one connection, ``/api/page/live``): how many alerts were published
# since the alerts table was drawn and how many cases changed since the queue was, each
# said above its table ("12 cases updated — show"); "show" draws that table's rows again
# (the page's size at most), so nothing moves under the analyst's hand, and the page holds
# no more rows than it was drawn with. The stream's figures are redrawn with each health
# event. The browser reconnects by itself from the last position it had. A click drawn in
# place leaves the feed open (the queue drawn again: its count starts from that drawing).
_LIVE_SCRIPT = """
(function () {
  if (window.velocityLive) { window.velocityLive.close(); window.velocityLive = null; }
  if (!document.body.dataset.live || !window.EventSource) { return; }
  // Looked up when needed: the queue may have been drawn again in place.
  function table(which) {
    return which === "queue" ? document.querySelector('[data-testid="queue"][data-as-of]')
      : document.querySelector('[data-testid="alerts"][data-after]');
  }
  var queue = table("queue"), alerts = table("alerts");
  var status = document.querySelector('[data-testid="live-status"]');
  var state = {
    after: alerts ? alerts.dataset.after : "",
    casesSince: queue ? queue.dataset.asOf : "",
    newAlerts: 0
  };
  function say(text) { if (status) { status.textContent = text; } }
  function notice(which, count, text) {
    var box = document.querySelector('[data-testid="' + which + '-notice"]');
    if (!box) { return; }
    box.querySelector('[data-testid="' + which + '-notice-text"]').textContent = text;
    box.hidden = count === 0;
    box.dataset.count = count;
  }
  function connect() {
    if (window.velocityLive) { window.velocityLive.close(); }
    var url = new URL(document.body.dataset.live, location.href);
    if (state.after) { url.searchParams.set("after", state.after); }
    if (state.casesSince) { url.searchParams.set("cases_since", state.casesSince); }
    var source = new EventSource(url.toString(), {withCredentials: true});
    window.velocityLive = source;
    source.onopen = function () { say("live: new alerts are counted above the table"); };
    source.onerror = function () { say("live: reconnecting…"); };
    source.addEventListener("alerts", function (event) {
      if (event.lastEventId) { state.after = event.lastEventId; }
      state.newAlerts += JSON.parse(event.data).count;
      var n = state.newAlerts;
      notice("alerts", n, n === 1 ? "1 new alert" : n.toLocaleString("en") + " new alerts");
    });
    source.addEventListener("position", function (event) {
      if (event.lastEventId) { state.after = event.lastEventId; }
    });
    source.addEventListener("cases", function (event) {
      var n = JSON.parse(event.data).count;
      notice("queue", n, n === 1 ? "1 case updated" : n.toLocaleString("en") + " cases updated");
    });
    source.addEventListener("health", function (event) {
      var health = document.getElementById("health");
      if (health) { health.innerHTML = JSON.parse(event.data).html; }
    });
    source.addEventListener("failed", function (event) {
      say("live: " + JSON.parse(event.data).error);
    });
  }
  function show(which, table) {
    fetch(table.dataset.rows, {credentials: "same-origin"})
      .then(function (reply) { return reply.json(); })
      .then(function (drawn) {
        var checked = {};
        table.querySelectorAll('input[name="case_id"]:checked').forEach(function (box) {
          checked[box.value] = true;
        });
        table.tBodies[0].innerHTML = drawn.html;
        table.querySelectorAll('input[name="case_id"]').forEach(function (box) {
          box.checked = !!checked[box.value];
        });
        if (which === "queue") {
          state.casesSince = String(drawn.asOf);
          table.dataset.asOf = drawn.asOf;
        } else {
          state.after = drawn.position;
          state.newAlerts = 0;
          var none = document.querySelector('[data-testid="no-alerts"]');
          if (none) { none.hidden = table.tBodies[0].rows.length > 0; }
        }
        notice(which, 0, "");
        if (window.velocityAgo) { window.velocityAgo(); }
        if (which === "queue" && window.velocityRefocus) { window.velocityRefocus(); }
        connect();
      });
  }
  document.addEventListener("click", function (event) {
    var button = event.target.closest ? event.target.closest("button[data-testid]") : null;
    var which = button && {"queue-show": "queue", "alerts-show": "alerts"}[button.dataset.testid];
    if (which && table(which)) { show(which, table(which)); }
  });
  // The queue drawn again in place (a filter, a close): its changes count from its
  // drawing, with its filter (the feed's URL); the alerts' count goes on.
  document.addEventListener("velocity:drawn", function (event) {
    var drawn = table("queue");
    if (!("queue" in (event.detail.parts || {})) || !drawn) { return; }
    state.casesSince = drawn.dataset.asOf;
    connect();
  });
  connect();
})();
"""

_VERBS = {"pause": "Pausing", "activate": "Activating", "delete": "Deleting"}


@dataclass(frozen=True)
class Flash:
    """The outcome of the last action, shown once at the top."""

    ok: bool
    text: str


@dataclass
class PageData:
    """Everything the page shows; a section whose data could not be read carries its error."""

    user: str
    can_edit: bool
    base: str  # the app's URL prefix, e.g. /velocity
    health: Mapping[str, Any] | None = None
    health_error: str | None = None
    rules: Sequence[Rule] = ()  # the rules in force (ACTIVE, PAUSE), one per ruleId
    rules_error: str | None = None
    # Each SHADOW candidate beside its rule in force, by ruleId.
    shadow: Sequence[ShadowComparison] | None = None
    shadow_error: str | None = None
    alerts: Sequence[Mapping[str, Any]] = ()
    alerts_error: str | None = None
    alert_filter: AlertFilter = field(default_factory=AlertFilter)
    filter_error: str | None = None  # the filter could not be read: no alerts listed
    alert_limit: int | None = None  # a page size asked for in the URL
    alerts_before: Cursor | None = None  # this page lists the alerts below it
    alerts_older: Cursor | None = None  # the next page's boundary, None at the last
    live_after: str | None = None  # the alert stream's position when read; None: not live
    # Every version of every rule, by (ruleId, version): the rule beside each alert.
    rule_versions: Mapping[tuple[int, int], Rule] = field(default_factory=dict)
    explanation: Mapping[str, Any] | None = None
    explanation_error: str | None = None
    lookup_form: Mapping[str, str] = field(default_factory=dict)
    lookup: Mapping[str, Any] | None = None
    lookup_error: str | None = None
    rule_text: str = ""
    flash: Flash | None = None
    reviews: Mapping[str, Review] | None = None  # the latest review of each reviewed alert
    reviews_error: str | None = None
    precision: Sequence[VersionPrecision] | None = None
    precision_error: str | None = None
    backfills: Sequence[BackfillRunView] | None = None  # newest first
    backfills_error: str | None = None
    # What the rules of the add-rules form would have fired (``Preview.to_json()``).
    preview: Mapping[str, Any] | None = None
    preview_error: str | None = None
    preview_hours: str = "1"
    # The page's URL parameters: every link, form and redirect keeps them.
    params: Mapping[str, str] = field(default_factory=dict)
    now_ms: int = 0  # when drawn (times read "3 min ago" from it); 0: shown as UTC times
    # The queue of cases (its view carries the filter, the page and what every link keeps).
    queue: cases_html.QueueView | None = None
    queue_page: CasePage | None = None
    queue_error: str | None = None
    # Each rule's alerts a minute over the last minutes, by ruleId.
    rule_rates: Mapping[int, RuleRate] | None = None
    rates_error: str | None = None
    write_behind_seconds: float = 30.0
    backfill_form: Mapping[str, Any] = field(default_factory=dict)  # as last written
    # The page's token for the signed-in session (``access.csrf_token``): every form that
    # posts carries it, and the page's meta for its script.
    csrf: str = ""


_time = alerts_html.time_text


def _error(text: str | None) -> str:
    return f'<p class="bad">{escape(text)}</p>' if text else ""


def health_html(h: Mapping[str, Any] | None, error: str | None) -> str:
    """The stream's verdict and figures (durations for people: "42 s", "5 min 8 s")."""
    if h is None:
        return _error(error or "no stream status")
    verdict_class = "ok" if h.get("healthy") else "bad"
    figures = [
        ("state", h.get("state")),
        ("batch", h.get("batch")),
        ("heartbeat age", duration_text(h.get("heartbeatAgeMs"))),
        ("lag", duration_text(h.get("lagMs"))),
        ("last batch", duration_text(h.get("lastBatchDurationMs"))),
        ("rows/s", h.get("processedRowsPerSecond")),
    ]
    shown = "".join(
        f"<span>{escape(name)}: <b>{escape(str(value))}</b></span>"
        for name, value in figures
        if value is not None
    )
    return (
        f'<p data-testid="stream-verdict" class="{verdict_class}">'
        f"<b>{escape(str(h.get('verdict')))}</b> — {escape(str(h.get('reason', '')))}</p>"
        f'<div class="health" data-testid="stream-figures">{shown}</div>'
    )


def _rule_actions(rule: Rule, base: str, token: str) -> str:
    def button(action: str, label: str) -> str:
        progress = f"{_VERBS[action]} ruleId {rule.rule_id}…"
        return (
            f'<form class="inline" method="post" action="{base}/rules/{rule.rule_id}/{action}" '
            f'data-progress="{escape(progress)}" data-in-place>{token_input(token)}'
            f'<button type="submit" data-testid="{action}-{rule.rule_id}">{label}</button></form>'
        )

    toggle = (
        button("pause", "Pause")
        if rule.state is RuleState.ACTIVE
        else button("activate", "Activate")
    )
    confirm = button("delete", f"Delete ruleId {rule.rule_id}")
    delete = f'<details class="inline"><summary>Delete…</summary>{confirm}</details>'
    return toggle + delete


def outcome_cell(rule: Rule, data: PageData) -> str:
    """A rule's outcome (SPEC §2: what a firing asks of the payment); for an editor, set
    here as a new version of the rule, like any change of it."""
    shown = (
        f'<span class="outcome outcome-{rule.outcome.value}" '
        f'data-testid="outcome-{rule.rule_id}">{rule.outcome.value}</span>'
    )
    if not data.can_edit or rule.state is RuleState.SHADOW:
        return f"<td>{shown}</td>"
    choices = "".join(
        f'<option value="{o.value}"{" selected" if o is rule.outcome else ""}>{o.value}</option>'
        for o in Outcome
    )
    progress = f"Setting the outcome of ruleId {rule.rule_id}…"
    return (
        f'<td>{shown}<form class="inline" method="post" '
        f'action="{data.base}/rules/{rule.rule_id}/outcome" data-progress="{escape(progress)}" '
        "data-in-place>"
        f"{token_input(data.csrf)}"
        f'<select name="outcome" aria-label="outcome" '
        f'data-testid="outcome-choice-{rule.rule_id}">{choices}</select>'
        f'<button type="submit" data-testid="outcome-set-{rule.rule_id}">Set</button>'
        "</form></td>"
    )


def _rules(data: PageData) -> str:
    if data.rules_error:
        return _error(data.rules_error)
    if not data.rules:
        return '<p class="muted">No rules in force.</p>'
    head = "<tr><th>ruleId</th><th>version</th><th>state</th><th>rule</th><th>outcome</th>"
    head += f"<th>alerts a minute, last {RATE_MINUTES} min</th>"
    head += "<th>actions</th></tr>" if data.can_edit else "</tr>"
    candidates = {c.candidate.rule_id: c.candidate for c in data.shadow or ()}
    rows = [rule_row(rule, data, candidates.get(rule.rule_id)) for rule in data.rules]
    caption = (
        f'<p class="muted" data-testid="rates-caption">Alerts a minute over the last '
        f"{RATE_MINUTES} minutes by decision time, notified and suppressed by the rule's "
        "cooldown, from the alerts table: the stream writes it behind Redis by up to "
        f"{data.write_behind_seconds:g} s (write_behind_seconds), so the newest minutes fill "
        "in late, and suppressed alerts are only there (never on the alert stream). The "
        f"figure is the last whole minute's. ⚠ marks a rule that fires on over "
        f"{WARN_SHARE:.0%} of the payments accepted in those minutes.</p>"
    )
    rates_error = _error(data.rates_error)
    return f'{caption}{rates_error}<table data-testid="rules">{head}{"".join(rows)}</table>'


def rule_row(rule: Rule, data: PageData, candidate: Rule | None = None) -> str:
    """A rule in force: its row of the rules table, the part its pause, activate, delete or
    outcome redraws in place (``data-part="rule-<ruleId>"``); ``candidate``: its SHADOW
    candidate, if one stands."""
    actions = f"<td>{_rule_actions(rule, data.base, data.csrf)}</td>" if data.can_edit else ""
    beside = (
        f' <a href="#shadow" class="muted" data-testid="candidate-of-{rule.rule_id}">'
        f"candidate v{candidate.version} in shadow</a>"
        if candidate is not None
        else ""
    )
    return (
        f'<tr data-testid="rule-{rule.rule_id}" data-part="rule-{rule.rule_id}">'
        f"<td>{rule.rule_id}</td><td>{rule.version}</td>"
        f'<td class="state-{rule.state.value}">{rule.state.value}</td>'
        f"<td>{escape(rule_summary(rule))}{beside}</td>{outcome_cell(rule, data)}"
        f"{rates_cell((data.rule_rates or {}).get(rule.rule_id), data)}{actions}</tr>"
    )


def _minute_text(ms: int) -> str:
    return time_text(ms)[11:16]


def rates_cell(rate: RuleRate | None, data: PageData) -> str:
    """A rule's alerts a minute: a bar per minute (notified, suppressed; each minute's
    figures in its title), the last whole minute's figures, and a warning when it fires
    on over ``WARN_SHARE`` of the payments."""
    if rate is None:
        return '<td class="muted">—</td>'
    peak = max(*rate.notified, *rate.suppressed, 1)
    bars = "".join(
        f'<span class="minute" title="{_minute_text(start)} UTC: {notified:,} notified, '
        f'{suppressed:,} suppressed"><i class="n" style="height:{100 * notified // peak}%">'
        f'</i><i class="s" style="height:{100 * suppressed // peak}%"></i></span>'
        for start, notified, suppressed in zip(
            rate.minutes, rate.notified, rate.suppressed, strict=True
        )
    )
    last = -2 if len(rate.minutes) > 1 else -1  # the current minute is still filling
    figures = (
        f'<span data-testid="rate-figures">{rate.notified[last]:,} notified, '
        f"{rate.suppressed[last]:,} suppressed</span>"
    )
    share = rate.share
    warning = ""
    if share is not None and rate.fires_often:
        warning = (
            f'<br><span class="bad" data-testid="fires-often-{rate.rule_id}">⚠ fires on '
            f"{share:.0%} of payments ({rate.fired_payments:,} of {rate.payments:,})</span>"
        )
    return (
        f'<td data-testid="rates-{rate.rule_id}" '
        f'data-notified="{",".join(map(str, rate.notified))}" '
        f'data-suppressed="{",".join(map(str, rate.suppressed))}" '
        f'data-share="{"" if share is None else f"{share:.4f}"}">'
        f'<span class="bars">{bars}</span> {figures}{warning}</td>'
    )


def _preview_controls(data: PageData) -> str:
    """The hours field and the Preview button: the form posted to the preview (a read)."""
    return (
        f'<label>last <input name="hours" size="4" value="{escape(data.preview_hours)}" '
        'data-testid="preview-hours"> hours</label> '
        f'<button type="submit" name="intent" value="preview" formaction="{data.base}/preview" '
        'data-testid="preview-rule" data-progress="Previewing the rules over the events…">'
        "Preview</button>"
    )


_PREVIEW_WORDS = (
    "<b>Preview</b> shows, saving nothing, what the rules would have fired over the last "
    "hours of the live events (the backtest's engine), beside the versions in force, as "
    "<code>velocity rules preview</code>."
)


def _add_rule(data: PageData) -> str:
    if not data.can_edit:
        # A preview takes both cores for seconds: only a role that may change rules runs one.
        return '<p class="muted">Your role may read the rules but not change or preview them.</p>'
    return (
        f'<form method="post" action="{data.base}/rules" data-progress="Applying the rules…">'
        f"{token_input(data.csrf)}"
        "<p>A rule or an array of rules as JSON (SPEC §2), applied all or nothing as new "
        "versions, exactly as <code>velocity rules apply</code>; or added as SHADOW "
        "candidates beside the rules in force (decided like ACTIVE rules, their alerts kept "
        "from the alert stream and topic), as <code>velocity rules shadow</code>.</p>"
        f'<textarea name="rules_json" rows="6" data-testid="rule-json">{escape(data.rule_text)}'
        "</textarea><br>"
        '<button type="submit" name="intent" value="validate" data-testid="validate-rule" '
        'data-progress="Validating the rules…">'
        "Validate</button>"
        '<button type="submit" name="intent" value="apply" data-testid="apply-rule">Apply</button>'
        '<button type="submit" name="intent" value="shadow" data-testid="shadow-rule" '
        'data-progress="Adding the shadow candidates…">Shadow</button>'
        f' {_preview_controls(data)}<p class="muted">{_PREVIEW_WORDS}</p>'
        "</form>"
    )


def _alerts(data: PageData) -> str:
    view = alerts_html.AlertsView(
        base=data.base,
        can_edit=data.can_edit,
        query=data.alert_filter,
        rule_versions=data.rule_versions,
        limit=data.alert_limit,
        before=data.alerts_before,
        older=data.alerts_older,
        live_after=data.live_after,
        filter_error=data.filter_error,
        kept=data.params,
        now_ms=data.now_ms or None,
        csrf=data.csrf,
    )
    error = "; ".join(e for e in (data.alerts_error, data.reviews_error) if e) or None
    return alerts_html.alerts_section(data.alerts, view, data.reviews or {}, error)


def explanation_body(e: Mapping[str, Any]) -> str:
    """Why an alert fired (an explanation's JSON): the verdict, the arithmetic and the
    events of its window."""
    rows = "".join(
        f"<tr><td>{_time(ev['eventTime'])}</td><td>{escape(ev['transactionId'])}</td>"
        f"<td>{escape(ev['value'] or '')}</td></tr>"
        for ev in e["events"]
    )
    more = e["eventCount"] - len(e["events"])
    more_text = f'<p class="muted">… and {more} more events</p>' if more > 0 else ""
    verdict_class = "ok" if e["agrees"] else "bad"
    notification = e.get("notification")
    cooldown = (
        f'<p data-testid="explanation-notification">{escape(notification)}</p>'
        if notification
        else ""
    )
    return (
        f'<p data-testid="explanation-verdict" class="{verdict_class}">{escape(e["verdict"])}</p>'
        f"{cooldown}"
        f'<p data-testid="explanation-arithmetic"><code>{escape(e["arithmetic"])}</code></p>'
        f'<table data-testid="explanation-events"><tr><th>event time</th><th>transaction</th>'
        f"<th>value</th></tr>{rows}</table>{more_text}"
    )


def explanation_section(explanation: Mapping[str, Any] | None, error: str | None) -> str:
    """An alert's explanation asked for (``#explanation``), or why it cannot be given."""
    if error:
        return f'<h2 id="explanation">Explanation</h2>{_error(error)}'
    if explanation is None:
        return ""
    alert = explanation["alert"]
    return (
        f'<h2 id="explanation">Explanation of {escape(alert["kind"])} '
        f"<code>{escape(alert['alertId'])}</code></h2>"
        f"<p>ruleId {escape(str(alert['ruleId']))} v{escape(str(alert['ruleVersion']))}, key "
        f"<code>{escape(key_text(alert['key']))}</code>, window {_time(alert['windowStart'])} "
        f"… {_time(alert['windowEnd'])}</p>{explanation_body(explanation)}"
    )


def _explanation(data: PageData) -> str:
    return explanation_section(data.explanation, data.explanation_error)


def lookup_html(found: Mapping[str, Any]) -> str:
    """A window aggregate as the page shows values: the key as keys read, the value as a
    number (an empty window's null as such), the window's bounds as UTC times."""
    value = found.get("aggregateValue")
    shown = (
        '<span class="muted">none (an empty window)</span>' if value is None else number_text(value)
    )
    key = found.get("key")
    start, end = found.get("windowStart"), found.get("windowEnd")
    return (
        '<table class="facts" data-testid="lookup-result">'
        f"<tr><th>rule</th><td>ruleId {escape(str(found.get('ruleId')))}</td></tr>"
        f"<tr><th>key</th><td>{key_html(key) if isinstance(key, Mapping) else ''}</td></tr>"
        f'<tr><th>aggregate</th><td class="figure" data-testid="lookup-value" '
        f'data-value="{escape(str(value))}">{shown}</td></tr>'
        f'<tr><th>window (UTC)</th><td data-testid="lookup-window">{time_text(start)} … '
        f"{time_text(end)}</td></tr></table>"
    )


# What the window lookup's form sets in the page's URL (the rest kept).
LOOKUP_FIELDS = ("lookup_rule", "lookup_key", "alert")


def lookup_part(found: Mapping[str, Any] | None, error: str | None) -> str:
    """The lookup's result (or why there is none), the part the form redraws in place."""
    result = _error(error) if error else "" if found is None else lookup_html(found)
    return f'<div data-part="lookup-result">{result}</div>'


def _lookup(data: PageData) -> str:
    form = data.lookup_form
    kept = values_html.hidden_inputs(data.params, LOOKUP_FIELDS)
    return (
        f'<form method="get" action="{data.base}/" data-testid="lookup" '
        f'data-in-place="{data.base}/lookup" data-owns="{" ".join(LOOKUP_FIELDS)}">{kept}'
        f'ruleId <input name="lookup_rule" size="5" value="{escape(form.get("lookup_rule", ""))}"> '
        f'key <input name="lookup_key" size="40" placeholder="payerId=25,beneficiaryId=12" '
        f'value="{escape(form.get("lookup_key", ""))}"> '
        '<button type="submit" data-testid="lookup-submit">Look up</button></form>'
        f"{lookup_part(data.lookup, data.lookup_error)}"
    )


def _shadow(data: PageData) -> set[tuple[int, int]]:
    """The (ruleId, version)s of SHADOW candidates, standing or not."""
    return {key for key, rule in data.rule_versions.items() if rule.state is RuleState.SHADOW}


def document(title: str, body: str, live: str = "", csrf: str = "") -> str:
    """A whole page of the app: its styles and scripts around ``body``; ``live``: the URL
    of the page's live feed (none: not live); ``csrf``: the page's token, for its script."""
    styles = (
        _STYLE,
        review_html.STYLE,
        alerts_html.STYLE,
        shadow_html.STYLE,
        preview_html.STYLE,
        cases_html.STYLE,
        values_html.STYLE,
    )
    head_scripts = f"{_PROGRESS_SCRIPT}{_CLICK_SCRIPT}{values_html.AGO_SCRIPT}"
    live_attr = f' data-live="{escape(live)}"' if live else ""
    return (
        f'<!doctype html><html><head><meta charset="utf-8">{token_meta(csrf)}'
        f"<title>{escape(title)}</title>"
        f"<style>{''.join(styles)}</style><script>{head_scripts}</script></head>"
        f"<body{live_attr}>{body}"
        f"<script>{cases_html.QUEUE_SCRIPT}{_LIVE_SCRIPT}</script></body></html>"
    )


def _flash(data: PageData) -> str:
    if data.flash is None:
        return ""
    kind = "ok" if data.flash.ok else "bad"
    return f'<div class="flash {kind}" data-testid="flash">{escape(data.flash.text)}</div>'


_PROGRESS = (
    '<div class="flash busy" id="change-progress" data-testid="change-progress" '
    'role="status" aria-live="polite" hidden></div>'
)
_NAV = (
    '<p class="nav"><a href="#queue">Queue</a> · <a href="#stream">Stream</a> · '
    '<a href="#rules">Rules</a> · <a href="#backfills">Backfills</a> · '
    '<a href="#lookup">Window lookup</a> · <a href="#alerts">Alerts</a> · '
    '<a href="check" data-testid="nav-check">Try a payment</a></p>'
)


def _queue(data: PageData) -> str:
    if data.queue is None:
        return _error(data.queue_error or "the queue was not read")
    return cases_html.queue_part(data.queue_page, data.queue, data.queue_error)


def _backfills(data: PageData) -> str:
    form = ""
    if data.can_edit:
        back = cases_html.back_field(data.params)
        form = backfills_html.backfill_form(
            data.rules, data.backfill_form, data.base, back, data.csrf
        )
    table = backfills_html.backfill_table(data.backfills, data.backfills_error, data.now_ms)
    return f"{form}{table}"


def live_url(data: PageData) -> str:
    """The page's live feed, with the filters of its queue and its alerts."""
    query = values_html.query_string(data.params, ("alert", "lookup_rule", "lookup_key"))
    return f"{data.base}/api/page/live" + (f"?{query}" if query else "")


def _health(data: PageData) -> str:
    return health_html(data.health, data.health_error)


def _shadow_rules(data: PageData) -> str:
    return shadow_html.shadow_section(
        data.shadow, data.shadow_error, data.can_edit, data.base, data.csrf
    )


def render_page(data: PageData) -> str:
    role = "may change rules" if data.can_edit else "read-only"
    body = (
        f'<h1>Velocity</h1><p class="muted">Signed in as {escape(data.user)} ({role}).</p>'
        f"{_NAV}{_PROGRESS}{_flash(data)}"
        # An explanation is what the analyst just asked for: first.
        f"{_explanation(data)}"
        # So is a preview.
        f"{preview_html.preview_section(data.preview, data.preview_error, explanation_body)}"
        # The page opens on the queue: what analysts work.
        f'<h2 id="queue">Queue</h2>{_queue(data)}'
        f'<h2 id="stream">Stream</h2><div id="health">{_health(data)}</div>'
        f'<h2 id="rules">Rules in force</h2>{_rules(data)}'
        '<h2 id="shadow">Shadow rules</h2>'
        f"{_shadow_rules(data)}"
        "<h2>Alerts and precision by rule version</h2>"
        f"{review_html.precision_table(data.precision, data.precision_error, _shadow(data))}"
        f"<h2>Add or change rules</h2>{_add_rule(data)}"
        f'<h2 id="backfills">Backfill runs</h2>{_backfills(data)}'
        f'<h2 id="lookup">Window lookup</h2>{_lookup(data)}'
        f'<h2 id="alerts">Alerts</h2>{_alerts(data)}'
    )
    return document("Velocity", body, live_url(data), data.csrf)


def render_case(view: cases_html.CaseView, flash: Flash | None = None) -> str:
    """A case's page."""
    shown = ""
    if flash is not None:
        kind = "ok" if flash.ok else "bad"
        shown = f'<div class="flash {kind}" data-testid="flash">{escape(flash.text)}</div>'
    body = f"{_PROGRESS}{shown}{cases_html.case_section(view)}"
    return document(f"Velocity: case {key_text(view.case.key)}", body, csrf=view.queue.csrf)
