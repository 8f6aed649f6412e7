/* The upgrade/recovery timeline as SVG: instances as lanes (their own blue/green), operations as bands
   with the handoff H marked, gaps as red marks. Drawn here rather than with uPlot: it is a Gantt-like
   view of spans and events, not a series of values. Exposes window.RelayTimeline.draw(el, data). */
(function () {
  "use strict";
  var NS = "http://www.w3.org/2000/svg";

  function pad(n) { return (n < 10 ? "0" : "") + n; }
  function localTime(sec, withDate) {
    var d = new Date(sec * 1000);
    var t = pad(d.getHours()) + ":" + pad(d.getMinutes());
    return withDate ? d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()) + " " + t : t;
  }

  function el(name, attrs, parent, text) {
    var node = document.createElementNS(NS, name);
    Object.keys(attrs || {}).forEach(function (k) { node.setAttribute(k, attrs[k]); });
    if (text !== undefined) node.textContent = text;
    if (parent) parent.appendChild(node);
    return node;
  }

  function tip(node, text) { el("title", {}, node, text); return node; }

  function draw(container, data) {
    container.textContent = "";
    var width = Math.max(container.clientWidth - 12, 600);
    var left = 190, right = 16, laneH = 24, top = 22;
    var lanes = data.lanes || [], ops = data.operations || [], gaps = data.gaps || [];
    var rows = lanes.length + 2; /* operations row, gaps row, one row per instance */
    var height = top + rows * laneH + 26;
    var t0 = data.since, t1 = data.until, span = Math.max(t1 - t0, 1);
    var x = function (t) { return left + (Math.min(Math.max(t, t0), t1) - t0) / span * (width - left - right); };
    var svg = el("svg", { width: width, height: height, role: "img", "aria-label": "upgrade and recovery timeline" }, container);
    svg.dataset.lanes = lanes.length;

    /* time axis: ~8 ticks in local time, the date on the first tick and when the day changes */
    var axis = el("g", { "class": "axis" }, svg);
    var ticks = 8, lastDay = "";
    for (var i = 0; i <= ticks; i++) {
      var t = t0 + span * i / ticks, px = x(t);
      var day = new Date(t * 1000).toDateString();
      el("line", { x1: px, x2: px, y1: top - 4, y2: height - 24, stroke: "#e5e7eb" }, axis);
      el("text", { x: px, y: height - 8, "text-anchor": "middle" }, axis, localTime(t, span > 86400 || day !== lastDay && i > 0 || i === 0));
      lastDay = day;
    }

    function rowY(n) { return top + n * laneH; }
    el("text", { x: 4, y: rowY(0) + 16 }, svg, "operations");
    el("text", { x: 4, y: rowY(1) + 16 }, svg, "gaps declared");

    ops.forEach(function (op) {
      var x0 = x(op.start), x1 = Math.max(x(op.end), x0 + 4);
      var color = op.kind === "upgrade" ? "#7c3aed" : op.kind === "failover" ? "#0891b2" : "#ea580c";
      var g = el("g", { "class": "op op-" + op.kind }, svg);
      var text = op.label + " #" + op.id + " " + op.state + " (" + localTime(op.start, true) + ")";
      if (op.reason) text += "\n" + op.reason;
      if (op.handoff && op.handoff.length) {
        text += "\nH: " + op.handoff.map(function (h) { return "p" + h.partition + "=" + h.offset; }).join(", ");
      }
      tip(el("rect", { x: x0, y: rowY(0) + 3, width: x1 - x0, height: laneH - 6, fill: color, rx: 3, opacity: 0.85 }, g), text);
      el("text", { x: x1 + 4, y: rowY(0) + 16 }, g, op.label + " " + op.state);
      if (op.handoff_at) { /* H: the instant blue's leases closed and green's opened */
        var hx = x(op.handoff_at);
        el("line", { x1: hx, x2: hx, y1: rowY(0), y2: rowY(rows), stroke: color, "stroke-dasharray": "4 3" }, g);
        tip(el("text", { "class": "handoff-mark", x: hx + 3, y: rowY(rows) - 4, fill: color, "font-weight": "bold" }, g, "H"), text);
      }
    });

    gaps.forEach(function (gap) {
      var gx = x(gap.at), y = rowY(1);
      var g = el("g", { "class": "gap gap-" + gap.kind }, svg);
      var mark = el("path", {
        d: "M" + (gx - 6) + " " + (y + 4) + " L" + (gx + 6) + " " + (y + 4) + " L" + gx + " " + (y + laneH - 4) + " Z",
        fill: gap.kind === "lost" ? "#dc2626" : "#f59e0b"
      }, g);
      tip(mark, gap.topic + "[" + gap.partition + "] [" + gap.start_offset + ", " + gap.end_offset + ") " + gap.records + " records " + gap.kind + ": " + gap.reason);
    });

    lanes.forEach(function (lane, n) {
      var y = rowY(n + 2), x0 = x(lane.start), x1 = Math.max(x(lane.end), x0 + 3);
      var g = el("g", { "class": "lane", "data-instance": lane.id }, svg);
      el("text", { x: 4, y: y + 16 }, g, lane.label);
      var bar = el("rect", { x: x0, y: y + 3, width: x1 - x0, height: laneH - 6, fill: lane.color, rx: 3, opacity: lane.live ? 0.95 : 0.55 }, g);
      tip(bar, lane.label + " " + lane.state + "\n" + localTime(lane.start, true) + " \u2192 " + (lane.live ? "now" : localTime(lane.end, true)));
      if (x1 - x0 > 60) el("text", { x: x0 + 6, y: y + 16, fill: "#fff" }, g, lane.state);
    });
  }

  window.RelayTimeline = { draw: draw, localTime: localTime };
})();
