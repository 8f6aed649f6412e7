/* The Relay page: reads the JSON endpoints (same origin: the Airflow UI's _token cookie goes along),
   draws the time series with uPlot and the timeline with RelayTimeline, refreshes every 30 s.
   window.relay exposes the drawn charts (uPlot instances, point counts) for the browser test. */
(function () {
  "use strict";
  var REFRESH_MS = 30000;
  var state = { pipeline: null, charts: {}, points: {}, loaded: 0, timer: null };
  window.relay = state;

  function $(id) { return document.getElementById(id); }
  function pad(n) { return (n < 10 ? "0" : "") + n; }
  function local(iso) { /* ISO from the server -> "YYYY-MM-DD HH:MM:SS" in the browser's time zone */
    if (!iso) return "";
    var d = new Date(iso);
    return d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()) + " " +
      pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds());
  }
  function text(tag, value, cls) {
    var node = document.createElement(tag);
    node.textContent = value === null || value === undefined ? "" : String(value);
    if (cls) node.className = cls;
    return node;
  }
  function showError(message) {
    var box = $("error");
    box.hidden = !message;
    box.textContent = message || "";
  }

  function get(path) {
    return fetch(path, { credentials: "same-origin", headers: { Accept: "application/json" } }).then(function (r) {
      if (r.status === 401) throw new Error("not logged in to Airflow (or the session expired): log in again");
      if (!r.ok) return r.json().then(function (b) { throw new Error(b.detail || r.statusText); }, function () { throw new Error(r.statusText); });
      return r.json();
    });
  }

  /* -- time series ------------------------------------------------------------------------------ */
  function axisTimes(u, splits) { /* local "HH:MM", with the date (ISO) on the first tick and at each new day */
    var lastDay = null;
    return splits.map(function (v) {
      var d = new Date(v * 1000);
      var day = d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate());
      var hm = pad(d.getHours()) + ":" + pad(d.getMinutes());
      var label = day !== lastDay ? hm + "\n" + day : hm;
      lastDay = day;
      return label;
    });
  }

  function fmtNumber(v) {
    if (v === null || v === undefined) return "";
    var a = Math.abs(v);
    if (a >= 1e6) return (v / 1e6).toFixed(a >= 1e7 ? 0 : 1) + "M";
    if (a >= 1e4) return (v / 1e3).toFixed(0) + "k";
    return a >= 100 || v === Math.round(v) ? String(Math.round(v)) : v.toFixed(1);
  }

  function drawChart(name, data, since, until, opts) {
    opts = opts || {};
    var box = $("chart-" + name);
    if (state.charts[name]) { state.charts[name].destroy(); delete state.charts[name]; }
    box.textContent = "";
    box.dataset.points = data.points;
    box.dataset.series = data.series.length;
    $("note-" + name).textContent = data.note || "";
    state.points[name] = data.points;
    if (!data.points) { box.appendChild(text("div", "no data in this window", "empty")); return; }
    var series = [{ label: "time", value: function (u, v) { return v === null ? "" : local(new Date(v * 1000).toISOString()); } }];
    data.series.forEach(function (s) {
      var one = { label: s.label, stroke: s.color, width: 1.5, spanGaps: true, value: function (u, v) { return v === null ? "-" : fmtNumber(v) + " " + data.unit; } };
      if (opts.bars) { one.fill = s.color; one.paths = uPlot.paths.bars({ size: [0.8, 40] }); one.points = { show: false }; }
      else if (data.x.length < 80) { one.points = { show: true, size: 5 }; }
      series.push(one);
    });
    var columns = [data.x].concat(data.series.map(function (s) { return s.values; }));
    var chart = new uPlot({
      width: Math.max(box.clientWidth, 300),
      height: opts.height || 220,
      series: series,
      scales: { x: { time: true, range: function () { return [since, until]; } }, y: { range: function (u, min, max) { return [Math.min(0, min), max > 0 ? max * 1.08 : 1]; } } },
      axes: [{ values: axisTimes, space: 70 }, { label: data.unit, size: 60, values: function (u, vals) { return vals.map(fmtNumber); } }],
      legend: { live: true },
      cursor: { drag: { x: true, y: false } }
    }, columns, box);
    state.charts[name] = chart;
  }

  /* -- panels ----------------------------------------------------------------------------------- */
  function drawHealth(health) {
    var badge = $("health-status"), list = $("health-checks");
    list.textContent = "";
    if (!health) { badge.textContent = "none yet"; badge.className = "badge"; $("health-when").textContent = "(relay_health runs every 5 min)"; return; }
    badge.textContent = health.status;
    badge.className = "badge " + health.status;
    $("health-when").textContent = local(health.iso) + (health.run_state ? " \u2022 job " + health.run_state : "");
    health.checks.forEach(function (c) {
      var li = document.createElement("li");
      li.className = c.level;
      li.appendChild(text("strong", c.name + " "));
      li.appendChild(text("span", c.level, "badge " + c.level));
      li.appendChild(text("div", c.message));
      if (c.action && c.level !== "OK") li.appendChild(text("div", "\u2192 " + c.action, "action"));
      list.appendChild(li);
    });
  }

  function drawInstances(cards) {
    var box = $("instances");
    box.textContent = "";
    if (!cards.length) box.appendChild(text("div", "no instance yet: run the DAG relay_deploy", "muted"));
    cards.forEach(function (c) {
      var card = document.createElement("div");
      card.className = "card instance";
      card.dataset.instance = c.id;
      card.dataset.state = c.state;
      card.style.borderTopColor = c.swatch;
      card.dataset.role = c.role || "";
      card.appendChild(text("div", "#" + c.id + " " + c.version + " \u2022 " + c.color + (c.role === "hot-standby" ? " \u2022 hot standby" : ""), "title"));
      card.appendChild(text("div", c.state + (c.attempt_state ? " \u2022 attempt " + c.attempt_state : "") + " \u2022 epoch " + c.epoch + " \u2022 " + c.attempts + " attempt(s)"));
      card.appendChild(text("div", "since " + local(c.created_iso), "muted"));
      if (c.error) card.appendChild(text("div", c.error, "error"));
      c.leases.forEach(function (l) {
        var end = l.end === null ? "\u221e" : l.end;
        card.appendChild(text("div", "p" + l.partition + " [" + l.start + ", " + end + ") cursor " + l.cursor, "leases"));
      });
      box.appendChild(card);
    });
  }

  function drawHistory(tl) {
    RelayTimeline.draw($("timeline"), tl);
    var ops = $("operations"), gaps = $("gaps");
    ops.textContent = ""; gaps.textContent = "";
    if (!tl.operations.length) ops.appendChild(text("li", "no upgrade or recovery yet", "muted"));
    tl.operations.slice().reverse().forEach(function (op) {
      var li = document.createElement("li");
      li.className = "operation";
      li.appendChild(text("strong", op.label + " #" + op.id + " "));
      li.appendChild(text("span", op.state, "badge " + (op.state === "DONE" || op.state === "EXECUTED" ? "OK" : op.state === "FAILED" || op.state === "ABORTED" ? "CRITICAL" : "WARN")));
      li.appendChild(text("div", local(op.start_iso) + " \u2192 " + local(op.end_iso), "muted"));
      if (op.handoff && op.handoff.length) {
        li.appendChild(text("code", "H = " + op.handoff.map(function (h) { return "p" + h.partition + ":" + h.offset; }).join(", ") + (op.handoff_iso ? " at " + local(op.handoff_iso) : ""), "handoff"));
      }
      if (op.targets && op.targets.length) {
        li.appendChild(text("code", "targets " + op.targets.map(function (h) { return "p" + h.partition + ":" + h.offset; }).join(", ")));
      }
      li.appendChild(text("div", op.history.map(function (h) { return h.state; }).join(" \u2192 "), "muted"));
      if (op.error) li.appendChild(text("div", op.error, "error"));
      ops.appendChild(li);
    });
    if (!tl.gaps.length) gaps.appendChild(text("li", "no gap declared", "muted"));
    tl.gaps.slice().reverse().forEach(function (g) {
      var li = document.createElement("li");
      li.className = "gap";
      li.appendChild(text("code", g.topic + "[" + g.partition + "] [" + g.start_offset + ", " + g.end_offset + ")"));
      li.appendChild(text("strong", " " + g.records + " record(s) " + g.kind));
      li.appendChild(text("div", local(g.iso) + " \u2022 " + g.reason, "muted"));
      gaps.appendChild(li);
    });
  }

  function drawDeadLetters(dead) {
    var total = $("dead-total"), body = document.querySelector("#dead-table tbody");
    total.textContent = dead.total;
    total.className = "badge " + (dead.total ? "WARN" : "OK");
    body.textContent = "";
    dead.recent.forEach(function (d) {
      var tr = document.createElement("tr");
      [local(d.iso), "#" + d.instance_id, d.topic + "[" + d.partition + "]", d.offset, d.key, d.value].forEach(function (v) { tr.appendChild(text("td", v)); });
      tr.appendChild(text("td", d.error, "err"));
      body.appendChild(tr);
    });
  }

  /* -- loading ---------------------------------------------------------------------------------- */
  function load() {
    var p = encodeURIComponent(state.pipeline), hours = $("hours").value;
    var base = "api/pipelines/" + p;
    return Promise.all([get(base + "/overview"), get(base + "/plots?hours=" + hours), get(base + "/timeline?hours=" + hours)])
      .then(function (all) {
        var overview = all[0], plots = all[1], tl = all[2];
        drawHealth(overview.health);
        drawInstances(overview.instances);
        drawChart("lag", plots.lag, plots.since, plots.until);
        drawChart("throughput", plots.throughput, plots.since, plots.until);
        drawChart("duration", plots.duration, plots.since, plots.until);
        drawChart("cursors", plots.cursors, plots.since, plots.until);
        drawChart("dead", plots.dead_letters, plots.since, plots.until, { bars: true, height: 140 });
        drawHistory(tl);
        drawDeadLetters(overview.dead_letters);
        $("updated").textContent = "updated " + local(overview.generated_iso) + (plots.kafka.ok ? "" : " \u2022 live lag unavailable: " + plots.kafka.error);
        showError("");
        state.loaded += 1;
        document.body.dataset.loaded = state.loaded;
      })
      .catch(function (e) { showError(e.message); document.body.dataset.error = e.message; });
  }

  function schedule() {
    clearInterval(state.timer);
    state.timer = setInterval(load, REFRESH_MS);
  }

  function start() {
    get("api/pipelines").then(function (info) {
      var select = $("pipeline");
      info.pipelines.forEach(function (name) { var o = text("option", name); o.value = name; select.appendChild(o); });
      var wanted = new URLSearchParams(location.search).get("pipeline");
      state.pipeline = info.pipelines.indexOf(wanted) >= 0 ? wanted : info.default;
      if (!state.pipeline) { showError("the ledger has no pipeline yet"); return; }
      select.value = state.pipeline;
      select.addEventListener("change", function () { state.pipeline = select.value; load(); });
      $("hours").addEventListener("change", load);
      window.addEventListener("resize", function () {
        Object.keys(state.charts).forEach(function (k) {
          var c = state.charts[k]; c.setSize({ width: Math.max(c.root.parentNode.clientWidth, 300), height: c.height });
        });
      });
      return load().then(schedule);
    }).catch(function (e) { showError(e.message); document.body.dataset.error = e.message; });
  }

  start();
})();
