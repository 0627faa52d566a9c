// infercap console: live updates over the console WebSocket, falling back to periodic refresh.
// The server renders every region; on an event the page re-fetches itself and swaps the regions
// marked data-live-region, so the live view and a full reload always show the same thing.
(function () {
  "use strict";
  // Page-level override (window.infercapPollMs) lets tests shorten the fallback period.
  var POLL_MS = Number(window.infercapPollMs) > 0 ? Number(window.infercapPollMs) : 15000;
  var status = document.getElementById("live-status");
  var log = document.getElementById("live-log");
  var body = document.body;
  var socket = null, retryMs = 1000, pollTimer = null, refreshTimer = null;

  function setState(state, text) {
    if (!status) return;
    status.dataset.state = state;
    status.textContent = text;
    body.dataset.liveState = state;
  }

  function refreshRegions() {
    var regions = document.querySelectorAll("[data-live-region][id]");
    if (!regions.length) return Promise.resolve();
    return fetch(window.location.href, { credentials: "same-origin", headers: { "X-Requested-With": "fetch" } })
      .then(function (r) { if (!r.ok) throw new Error(r.status); return r.text(); })
      .then(function (html) {
        var doc = new DOMParser().parseFromString(html, "text/html");
        regions.forEach(function (region) {
          var fresh = doc.getElementById(region.id);
          if (fresh && !region.contains(document.activeElement)) region.innerHTML = fresh.innerHTML;
        });
        body.dataset.refreshed = String(Date.now());
      })
      .catch(function () { /* next event or poll tries again */ });
  }

  function scheduleRefresh() {
    clearTimeout(refreshTimer);
    refreshTimer = setTimeout(refreshRegions, 250);
  }

  function watchedIds() {
    return (body.dataset.watch || "").split(",").map(function (s) { return parseInt(s, 10); })
      .filter(function (n) { return !isNaN(n); });
  }

  function onQueue(payload) {
    var total = 0;
    Object.keys(payload.queued || {}).forEach(function (cls) {
      var n = payload.queued[cls];
      total += n;
      document.querySelectorAll('[data-queue="' + payload.endpoint_id + '"][data-class="' + cls + '"]')
        .forEach(function (el) { el.textContent = String(n); });
    });
    document.querySelectorAll('[data-queue-total="' + payload.endpoint_id + '"]')
      .forEach(function (el) { el.textContent = String(total); });
  }

  function announce(kind, p) {
    var text = kind === "replica" ? "Replica " + p.replica + " of " + p.endpoint + " is " + p.state
      : kind === "alert" ? "Alert on " + p.slo + ": " + p.state
      : kind === "decision" ? "Autoscaler: " + p.current + " → " + p.desired + " (" + p.reason + ")"
      : kind === "endpoint" ? "Endpoint " + p.endpoint + " changed"
      : kind === "rollout" ? "Rollout of " + p.endpoint + ": " + p.message : "";
    if (log && text) log.textContent = text;
    body.dataset.lastEvent = kind;
  }

  function startPolling() {
    if (!pollTimer) pollTimer = setInterval(refreshRegions, POLL_MS);
  }

  function stopPolling() {
    clearInterval(pollTimer);
    pollTimer = null;
  }

  function connect() {
    if (!("WebSocket" in window) || !body.dataset.wsPath || !status) { startPolling(); return; }
    var scheme = window.location.protocol === "https:" ? "wss://" : "ws://";
    socket = new WebSocket(scheme + window.location.host + body.dataset.wsPath);
    socket.onopen = function () {
      retryMs = 1000;
      stopPolling();
      setState("live", "● live");
      var ids = watchedIds();
      if (ids.length) socket.send(JSON.stringify({ watch: ids }));
    };
    socket.onmessage = function (message) {
      var event;
      try { event = JSON.parse(message.data); } catch (e) { return; }
      if (event.kind === "queue") { onQueue(event.payload); return; }
      if (["replica", "endpoint", "alert", "decision", "rollout"].indexOf(event.kind) >= 0) {
        announce(event.kind, event.payload);
        scheduleRefresh();
      }
    };
    socket.onclose = function () {
      setState("polling", "◐ refreshing every " + POLL_MS / 1000 + " s");
      startPolling();
      setTimeout(connect, retryMs);
      retryMs = Math.min(retryMs * 2, 30000);
    };
  }

  function focusFirstError() {
    var bad = document.querySelector(".has-error input, .has-error select, .has-error textarea");
    if (bad) bad.focus();
  }

  document.addEventListener("DOMContentLoaded", function () {
    focusFirstError();
    connect();
  });
})();
