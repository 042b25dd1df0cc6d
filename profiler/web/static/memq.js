/* memq pages: draws the charts of a page from the JSON the server embedded in #page-data.
   Plain SVG, no library, nothing fetched. Text from snapshots (frames, names) is only ever set
   through textContent, never parsed as HTML. Licence: the project's (Apache-2.0). */
(function () {
  "use strict";
  var NS = "http://www.w3.org/2000/svg";
  var CATS = ["parameters", "gradients", "optimizer_state", "activations", "workspace", "other", "unknown"];

  function el(tag, attrs, parent, text) {
    var e = document.createElementNS(NS, tag);
    for (var k in attrs) { if (attrs[k] !== null && attrs[k] !== undefined) e.setAttribute(k, attrs[k]); }
    if (text !== undefined) e.textContent = text;
    if (parent) parent.appendChild(e);
    return e;
  }
  function h(tag, cls, parent, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    if (parent) parent.appendChild(e);
    return e;
  }
  function fmtBytes(n) {
    if (n === null || n === undefined) return "n/a";
    var s = n < 0 ? "-" : ""; n = Math.abs(n);
    var units = [["GiB", 1073741824], ["MiB", 1048576], ["KiB", 1024]];
    for (var i = 0; i < units.length; i++) if (n >= units[i][1]) return s + (n / units[i][1]).toFixed(2) + " " + units[i][0];
    return s + Math.round(n) + " B";
  }
  function svgFor(container, width, height) {
    var w = width || Math.max(320, container.clientWidth || 900);
    return el("svg", {width: w, height: height, viewBox: "0 0 " + w + " " + height, "class": "plot"}, container);
  }
  function niceMax(v) {
    if (!(v > 0)) return 1;
    var p = Math.pow(2, Math.ceil(Math.log(v) / Math.log(2)));
    return p / 2 >= v ? p / 2 : (p * 0.75 >= v ? p * 0.75 : p);
  }
  function yAxis(svg, x0, x1, y, ymax, ticks) {
    for (var i = 0; i <= ticks; i++) {
      var v = ymax * i / ticks, yy = y(v);
      el("line", {x1: x0, x2: x1, y1: yy, y2: yy, "class": "grid"}, svg);
      el("text", {x: x0 - 6, y: yy + 4, "class": "tick", "text-anchor": "end"}, svg, fmtBytes(v));
    }
  }
  function parseT(s) { return s ? Date.parse(s) : NaN; }
  function fmtTime(ms) { var d = new Date(ms); return d.toISOString().slice(11, 19); }
  function fmtDay(ms) { return new Date(ms).toISOString().slice(0, 10); }

  var dataEl = document.getElementById("page-data");
  var DATA = dataEl ? JSON.parse(dataEl.textContent) : null;

  /* ------------------------------------------------------------------ run page: memory timeline */
  function runTimeline(box, hist, lanes) {
    var snaps = hist.snapshots || [];
    var series = (hist.stats && hist.stats.series) || [];
    var run = hist.run || {};
    var limit = run.memory_limit_bytes || null;
    snaps.forEach(function (s) { if (!limit && s.oom && s.oom.limit_bytes) limit = s.oom.limit_bytes; });
    var pts = [];
    series.forEach(function (p) { pts.push(parseT(p.t)); });
    snaps.forEach(function (s) { pts.push(parseT(s.taken_at)); });
    var times = pts.filter(function (t) { return !isNaN(t); });
    var useIndex = times.length === 0;
    // the forecast OOM (agent clock, seconds): the projection runs from its moment to the limit
    var fc = hist.forecast || null, fcFrom = null, fcTo = null;
    if (fc && fc.oom_expected && fc.as_of_time && fc.eta_s !== null && fc.eta_s !== undefined && !useIndex) {
      fcFrom = fc.as_of_time * 1000; fcTo = (fc.as_of_time + fc.eta_s) * 1000;
      if (!limit && fc.limit_bytes) limit = fc.limit_bytes;
    }
    if (fcTo !== null) times.push(fcTo);
    var t0 = useIndex ? 0 : Math.min.apply(null, times), t1 = useIndex ? Math.max(1, snaps.length - 1) : Math.max.apply(null, times);
    if (t1 === t0) { t0 -= 60000; t1 += 60000; }
    var ymax = 0;
    series.forEach(function (p) { ymax = Math.max(ymax, p.reserved_bytes || 0, p.allocated_bytes || 0); });
    snaps.forEach(function (s) {
      ymax = Math.max(ymax, s.reserved_bytes || 0);
      if (s.oom && s.oom.requested_bytes) ymax = Math.max(ymax, (s.allocated_bytes || 0) + s.oom.requested_bytes);
    });
    // the samples are read between steps, so their allocated line sits below what a step reached:
    // the run's peak allocated is drawn beside it, the figure the header and the verdict use
    var peakAlloc = run.peak_allocated_bytes || null;
    if (peakAlloc) ymax = Math.max(ymax, peakAlloc);
    if (limit) ymax = Math.max(ymax, limit);
    ymax = niceMax(ymax * 1.05);
    var W = Math.max(480, box.clientWidth || 900), H = 300, L = 78, R = 16, T = 14, B = 30;
    var svg = svgFor(box, W, H);
    svg.setAttribute("id", "timeline-svg");
    var x = function (t) { return L + (t - t0) / (t1 - t0) * (W - L - R); };
    var y = function (v) { return T + (1 - v / ymax) * (H - T - B); };
    yAxis(svg, L, W - R, y, ymax, 4);
    for (var i = 0; i <= 4; i++) {
      var tt = t0 + (t1 - t0) * i / 4;
      el("text", {x: x(tt), y: H - 10, "class": "tick", "text-anchor": i === 0 ? "start" : (i === 4 ? "end" : "middle")}, svg,
         useIndex ? "#" + Math.round(tt) : (i === 0 ? fmtDay(tt) + " " : "") + fmtTime(tt));
    }
    function line(points, cls) {
      if (points.length < 1) return;
      var d = points.map(function (p, j) { return (j ? "L" : "M") + p[0].toFixed(1) + "," + p[1].toFixed(1); }).join("");
      if (points.length === 1) d += "h1";
      el("path", {d: d, "class": cls}, svg);
    }
    var snapT = function (s, j) { return useIndex ? j : parseT(s.taken_at); };
    if (series.length) {
      line(series.filter(function (p) { return p.reserved_bytes !== null; }).map(function (p) { return [x(parseT(p.t)), y(p.reserved_bytes)]; }), "reserved");
      line(series.filter(function (p) { return p.allocated_bytes !== null; }).map(function (p) { return [x(parseT(p.t)), y(p.allocated_bytes)]; }), "allocated");
    } else {
      var main = hist.stats ? hist.stats.rank : null;
      var own = snaps.filter(function (s) { return main === null || s.rank === main; });
      // a snapshot not analysed yet (or quarantined) has no figures: the lines skip it, not drop to zero
      var known = function (k) { return own.map(function (s, j) { return [snapT(s, j), s[k]]; })
        .filter(function (q) { return q[1] !== null && q[1] !== undefined; }); };
      line(known("reserved_bytes").map(function (q) { return [x(q[0]), y(q[1])]; }), "reserved");
      line(known("allocated_bytes").map(function (q) { return [x(q[0]), y(q[1])]; }), "allocated");
      document.getElementById("timeline-note").textContent =
        "No stat samples stored for this run: the lines join the snapshots' own figures.";
    }
    if (fcTo !== null && limit) {
      var from = Math.max(0, limit - (fc.headroom_bytes || 0));
      var p = el("path", {d: "M" + x(Math.max(t0, fcFrom)).toFixed(1) + "," + y(from).toFixed(1) + "L" + x(fcTo).toFixed(1) + "," +
                         y(limit).toFixed(1), "class": "forecast", id: "forecast-line"}, svg);
      var stepTxt = fc.step !== null && fc.step !== undefined ? "step " + fc.step : null;
      el("title", {}, p, "forecast: the step's need reaches the limit" + (fc.epoch !== null ? " in epoch " + fc.epoch : "") + (stepTxt ? " (" + stepTxt + ")" : ""));
      el("text", {x: x(fcTo) - 4, y: y(limit) + 14, "class": "label forecast-label", "text-anchor": "end"}, svg,
         "forecast OOM" + (fc.epoch !== null ? " · epoch " + fc.epoch : "") + (stepTxt ? " · " + stepTxt : ""));
    }
    if (limit) {
      el("line", {x1: L, x2: W - R, y1: y(limit), y2: y(limit), "class": "limit"}, svg);
      el("text", {x: W - R - 4, y: y(limit) - 4, "class": "label limit-label", "text-anchor": "end"}, svg, "limit " + fmtBytes(limit));
    }
    if (peakAlloc) {
      el("line", {x1: L, x2: W - R, y1: y(peakAlloc), y2: y(peakAlloc), "class": "peak-alloc", id: "peak-allocated-line"}, svg);
      var near = limit && Math.abs(y(limit) - y(peakAlloc)) < 14;
      el("text", {x: L + 4, y: y(peakAlloc) + (near ? 14 : -4), "class": "label peak-alloc-label"}, svg,
         "peak allocated " + fmtBytes(peakAlloc) + " (within a step; the line is read between steps)");
    }
    snaps.forEach(function (s, j) {
      var t = snapT(s, j);
      if (isNaN(t)) return;
      var a = el("a", {href: "/snapshots/" + s.id}, svg);
      var cx = x(t), cy = y(s.reserved_bytes || 0);
      if (s.oom) {
        var need = (s.allocated_bytes || 0) + (s.oom.requested_bytes || 0);
        el("line", {x1: cx, x2: cx, y1: T, y2: H - B, "class": "oom-line"}, svg);
        if (s.oom.requested_bytes) el("line", {x1: cx, x2: cx, y1: y(s.allocated_bytes || 0), y2: y(need), "class": "oom-request"}, svg);
        var g = el("g", {"class": "oom-mark", "data-snapshot": s.id}, a);
        el("circle", {cx: cx, cy: cy, r: 10, "class": "hit"}, g);
        el("path", {d: "M" + (cx - 7) + "," + (cy - 7) + "L" + (cx + 7) + "," + (cy + 7) + "M" + (cx - 7) + "," + (cy + 7) + "L" + (cx + 7) + "," + (cy - 7)}, g);
        el("title", {}, g, "OOM: requested " + fmtBytes(s.oom.requested_bytes) + " with " + fmtBytes(s.allocated_bytes) + " allocated");
        el("text", {x: cx - 8, y: T + 12, "class": "label oom-label", "text-anchor": "end"}, svg,
           "OOM · requested " + fmtBytes(s.oom.requested_bytes));
      } else {
        var c = el("circle", {cx: cx, cy: cy, r: 5, "class": "snap-mark", "data-snapshot": s.id}, a);
        el("title", {}, c, s.trigger + (s.epoch !== null ? " epoch " + s.epoch : "") + ": reserved " + fmtBytes(s.reserved_bytes));
      }
    });
    return {t0: t0, t1: t1, useIndex: useIndex};
  }

  function runLanes(box, lanes, dom) {
    if (!lanes || !lanes.lanes || !lanes.lanes.length) { h("p", "note", box, "no ranks with data"); return; }
    var W = Math.max(480, box.clientWidth || 900), LH = 44, L = 78, R = 16;
    var svg = svgFor(box, W, lanes.lanes.length * LH + 8);
    var ymax = 1;
    lanes.lanes.forEach(function (ln) {
      (ln.stats.series || []).forEach(function (p) { ymax = Math.max(ymax, p.reserved_bytes || 0); });
      ln.snapshots.forEach(function (s) { ymax = Math.max(ymax, s.reserved_bytes || 0); });
    });
    var x = function (t) { return L + (t - dom.t0) / (dom.t1 - dom.t0) * (W - L - R); };
    lanes.lanes.forEach(function (ln, i) {
      var top = 4 + i * LH, bot = top + LH - 8;
      var y = function (v) { return bot - (v / ymax) * (LH - 12); };
      el("rect", {x: L, y: top, width: W - L - R, height: LH - 8, "class": "lane"}, svg);
      el("text", {x: L - 8, y: top + LH / 2, "class": "tick", "text-anchor": "end"}, svg, "rank " + ln.rank);
      var ser = (ln.stats.series || []).filter(function (p) { return p.reserved_bytes !== null && !isNaN(parseT(p.t)); });
      var pts = ser.length ? ser.map(function (p) { return [x(parseT(p.t)), y(p.reserved_bytes)]; })
        : ln.snapshots.filter(function (s) { return !isNaN(parseT(s.taken_at)); }).map(function (s) { return [x(parseT(s.taken_at)), y(s.reserved_bytes || 0)]; });
      if (pts.length) el("path", {d: pts.map(function (p, j) { return (j ? "L" : "M") + p[0].toFixed(1) + "," + p[1].toFixed(1); }).join("") + (pts.length === 1 ? "h1" : ""), "class": "reserved"}, svg);
      ln.snapshots.forEach(function (s, j) {
        var t = dom.useIndex ? j : parseT(s.taken_at);
        if (isNaN(t)) return;
        var a = el("a", {href: "/snapshots/" + s.id}, svg);
        var c = el("circle", {cx: x(t), cy: y(s.reserved_bytes || 0), r: s.oom_requested_bytes ? 6 : 4,
                              "class": s.oom_requested_bytes ? "oom-dot" : "snap-mark"}, a);
        el("title", {}, c, "rank " + ln.rank + " " + s.trigger + ": reserved " + fmtBytes(s.reserved_bytes));
      });
    });
  }

  /* --------------------------------------------------------------- snapshot page */
  function showFrames(panel, title, lines, stack) {
    panel.textContent = "";
    h("h3", null, panel, title);
    lines.forEach(function (l) { h("div", "kv", panel, l); });
    if (stack === null) { h("p", "hint", panel, "no frames recorded for this block (record with stacks=\"python\" or \"all\")"); return; }
    var ol = h("ol", "stack", panel);
    ol.id = "frame-list";
    stack.forEach(function (f) {
      var li = h("li", null, ol);
      h("span", "fn", li, f[2] || "?");
      h("span", "loc", li, " " + (f[0] || "?") + ":" + f[1]);
    });
  }

  /* The trace timeline: the overview the page came with (each point the highest of its bucket of
     events), then, once the packed per-event changes are unpacked, zoom into any range at full detail
     (every event when the range has fewer than two per pixel, else each pixel column's highest). */
  function b64bytes(s) {
    var bin = atob(s), u = new Uint8Array(bin.length);
    for (var i = 0; i < bin.length; i++) u[i] = bin.charCodeAt(i);
    return u;
  }

  function unpackDetail(d) {
    var stream = new Blob([b64bytes(d.gzip_b64)]).stream().pipeThrough(new DecompressionStream("gzip"));
    return new Response(stream).arrayBuffer().then(function (buf) {
      var n = d.n, C = d.categories, K = d.checkpoints;
      return {n: n, C: C, every: d.checkpoint, delta: new Float64Array(buf, 0, n), time: new Float64Array(buf, 8 * n, n),
              ckpt: new Float64Array(buf, 16 * n, K * C), cat: new Uint8Array(buf, 16 * n + 8 * K * C, n)};
    });
  }

  function windowRows(D, a, b, cols) {
    var C = D.C, lv = new Float64Array(C), k = Math.floor(a / D.every), i, c, tot = 0;
    for (c = 0; c < C; c++) lv[c] = D.ckpt[k * C + c];
    for (i = k * D.every; i < a; i++) { c = D.cat[i]; if (c !== 255) lv[c] += D.delta[i]; }
    for (c = 0; c < C; c++) tot += lv[c];
    // Each column: the composition at its highest total, and its lowest total (null when every event
    // is drawn: the bands then are the whole story).
    var idx = [], rows = [], low = [], every = b - a <= 2 * cols, per = every ? 1 : (b - a) / cols;
    var end = a + per, best = -Infinity, bestI = a, bestRow = null, lo = Infinity;
    for (i = a; i < b; i++) {
      c = D.cat[i];
      if (c !== 255) { lv[c] += D.delta[i]; tot += D.delta[i]; }
      if (every) { idx.push(i); rows.push(Array.from(lv)); continue; }
      if (tot > best) { best = tot; bestI = i; bestRow = Array.from(lv); }
      if (tot < lo) lo = tot;
      if (i + 1 >= end || i === b - 1) {
        idx.push(bestI); rows.push(bestRow); low.push(lo); best = -Infinity; lo = Infinity; end += per;
      }
    }
    return {idx: idx, rows: rows, low: every ? null : low};
  }

  var LOW_GAP_SHARE = 0.05;

  function catTimeline(box, view, panel) {
    var tl = view.timeline;
    var legend = document.getElementById("cat-legend");
    var cats = tl ? tl.categories : ["before_trace"].concat(CATS);
    cats.forEach(function (c) { var s = h("span", "lg", legend); h("span", "sw cat-" + c, s); s.appendChild(document.createTextNode(c.replace("_", " ") + " ")); });
    if (!tl || !tl.levels.length) {
      document.getElementById("cat-note").textContent = view.blob_error ? "The snapshot could not be read." :
        "This snapshot has no allocator trace (history recording was off): nothing to replay.";
      return;
    }
    var n = tl.events, D = null, win = [0, n];
    var bar = h("div", "zoombar", null);
    box.parentNode.insertBefore(bar, box);
    var out = h("button", null, bar, "zoom out"), all = h("button", null, bar, "whole trace");
    out.type = all.type = "button"; out.id = "cat-zoom-out"; all.id = "cat-zoom-all"; out.disabled = all.disabled = true;
    var info = h("span", "zoominfo", bar, "");
    info.id = "cat-zoom-info";
    var readout = h("p", "readout", null, "");
    readout.id = "cat-readout";
    box.parentNode.insertBefore(readout, box.nextSibling);
    var W = Math.max(320, box.clientWidth || 900), H = 260, L = 78, R = 16, T = 10, B = 28;
    var svg = null, pts = null, x = null, y = null;

    function timeOf(i) {
      if (D) return D.time[i];
      var k = 0; while (k + 1 < tl.idx.length && tl.idx[k + 1] <= i) k++;
      return tl.t[k] - tl.t[0];
    }
    function label(i) {
      return tl.time_unit === "us" ? (timeOf(i) / 1e6).toFixed(3) + " s" : "entry " + i;
    }

    function draw(idx, rows, a, b, low) {
      var t0 = performance.now();
      box.textContent = "";
      svg = svgFor(box, W, H);
      svg.setAttribute("id", "cat-svg");
      svg.setAttribute("data-window", a + "," + b);
      var m = idx.length, ymax = 0, tots = new Array(m);
      rows.forEach(function (r, k) { var s = 0; r.forEach(function (v) { s += v; }); tots[k] = s; ymax = Math.max(ymax, s); });
      ymax = niceMax(ymax * 1.05 || 1);
      svg.setAttribute("data-ymax", ymax);
      var span = Math.max(1, b - 1 - a);
      x = function (i) { return L + (i - a) / span * (W - L - R); };
      y = function (v) { return T + (1 - v / ymax) * (H - T - B); };
      yAxis(svg, L, W - R, y, ymax, 4);
      el("text", {x: L, y: H - 8, "class": "tick"}, svg, label(a));
      el("text", {x: W - R, y: H - 8, "class": "tick", "text-anchor": "end"}, svg,
         label(b - 1) + " (" + (b - a === n ? n + " trace entries" : "entries " + a + "-" + (b - 1) + " of " + n) + ")");
      var base = new Array(m).fill(0);
      cats.forEach(function (c, ci) {
        var top = base.map(function (v, k) { return v + rows[k][ci]; });
        if (top.every(function (v, k) { return v === base[k]; })) { base = top; return; }
        var d = "M" + x(idx[0]).toFixed(1) + "," + y(top[0]).toFixed(1);
        for (var k = 1; k < m; k++) d += "L" + x(idx[k]).toFixed(1) + "," + y(top[k]).toFixed(1);
        for (k = m - 1; k >= 0; k--) d += "L" + x(idx[k]).toFixed(1) + "," + y(base[k]).toFixed(1);
        var p = el("path", {d: d + "Z", "class": "band cat-" + c, "data-category": c}, svg);
        el("title", {}, p, c);
        p.addEventListener("click", function () { bandStacks(c); });
        base = top;
      });
      // The lowest total of each column, where a column folds many events: the troughs between the
      // peaks the bands show (a flat band over a million events is otherwise all the overview says).
      // Drawn only when the troughs sit well below the highs on average: within LOW_GAP_SHARE of the axis
      // (a dozen pixels) the line would trace the bands' top and say nothing they do not.
      var gap = 0;
      if (low && low.length === m) tots.forEach(function (v, k) { gap += v - low[k]; });
      var folded = m > 0 && low && low.length === m && gap / m > LOW_GAP_SHARE * ymax;
      if (folded) {
        var ld = "";
        for (var j = 0; j < m; j++) ld += (j ? "L" : "M") + x(idx[j]).toFixed(1) + "," + y(low[j]).toFixed(1);
        el("path", {d: ld, "class": "low-line", id: "cat-low"}, svg);
        var lowest = Math.min.apply(null, low), highest = Math.max.apply(null, low);
        el("text", {x: W - R - 4, y: Math.min(y(low[m - 1]) + 14, H - B - 4), "class": "label low-label",
                    "text-anchor": "end"}, svg,
           "lowest of each column: " + fmtBytes(lowest) + (highest > lowest ? " to " + fmtBytes(highest) : ""));
      }
      svg.setAttribute("data-low", folded ? "drawn" : "none");
      var oom = tl.oom_event;
      if (oom !== null && oom !== undefined && oom >= a && oom < b) {
        var ox = x(oom);
        el("line", {x1: ox, x2: ox, y1: T, y2: H - B, "class": "oom-line oom-mark"}, svg);
        el("text", {x: ox - 4, y: T + 12, "class": "label oom-label", "text-anchor": "end"}, svg, "OOM");
      }
      var pk = 0; tots.forEach(function (v, k) { if (v > tots[pk]) pk = k; });
      if (m) {
        var px = x(idx[pk]), right = px > W - 160;
        el("circle", {cx: px, cy: y(tots[pk]), r: 4, "class": "peak"}, svg);
        el("text", {x: right ? px - 6 : px + 6, y: y(tots[pk]) - 4, "class": "label", "text-anchor": right ? "end" : "start"}, svg,
           (b - a === n ? "peak " : "highest here ") + fmtBytes(tots[pk]));
      }
      pts = {idx: idx, rows: rows, tots: tots};
      var sel = el("rect", {x: 0, y: T, width: 0, height: H - T - B, "class": "zoomsel"}, svg);
      interact(svg, sel);
      win = [a, b];
      out.disabled = all.disabled = !D || b - a === n;
      var ms = performance.now() - t0;
      svg.setAttribute("data-render-ms", ms.toFixed(1));
      info.textContent = (b - a === n ? "whole trace" : "entries " + a + "-" + (b - 1)) +
        (folded ? " · bands: each column's highest point; line: its lowest" : "") +
        (D ? " · drag across the chart to zoom, wheel to zoom around the pointer" : " · unpacking the full detail...");
      return ms;
    }

    function bandStacks(c) {
      var ids = [];
      view.stack_categories.forEach(function (sc, si) { if (sc === c && ids.length < 5) ids.push(si); });
      panel.textContent = "";
      h("h3", null, panel, "band: " + c);
      if (!ids.length) h("p", "hint", panel, "no recorded stacks in this category");
      ids.forEach(function (si) {
        var ol = h("ol", "stack", panel);
        view.stacks[si].slice(0, 12).forEach(function (f) { var li = h("li", null, ol); h("span", "fn", li, f[2]); h("span", "loc", li, " " + f[0] + ":" + f[1]); });
      });
    }

    function indexAt(px) {
      var a = win[0], b = win[1];
      return Math.max(a, Math.min(b - 1, Math.round(a + (px - L) / (W - L - R) * Math.max(1, b - 1 - a))));
    }

    function svgX(ev) { var r = svg.getBoundingClientRect(); return (ev.clientX - r.left) * W / r.width; }

    function interact(s, sel) {
      var from = null;
      s.addEventListener("mousemove", function (ev) {
        var px = svgX(ev);
        if (from !== null) {
          sel.setAttribute("x", Math.min(from, px)); sel.setAttribute("width", Math.abs(px - from));
          return;
        }
        if (!pts || px < L || px > W - R) return;
        var i = indexAt(px), k = 0;
        while (k + 1 < pts.idx.length && pts.idx[k + 1] <= i) k++;
        var row = pts.rows[k], top = 0;
        row.forEach(function (v, ci) { if (v > row[top]) top = ci; });
        readout.textContent = "entry " + pts.idx[k] + " · " + label(pts.idx[k]) + " · live " + fmtBytes(pts.tots[k]) +
          " · largest band " + cats[top].replace("_", " ") + " " + fmtBytes(row[top]);
      });
      s.addEventListener("mousedown", function (ev) { if (D && ev.button === 0) { from = svgX(ev); ev.preventDefault(); } });
      s.addEventListener("mouseup", function (ev) {
        if (from === null) return;
        var px = svgX(ev), a = indexAt(Math.min(from, px)), b = indexAt(Math.max(from, px)) + 1, moved = Math.abs(px - from);
        from = null;
        sel.setAttribute("width", 0);
        if (moved >= 5 && b - a >= 2) zoom(a, b);  // a smaller move is a click (a band shows its stacks)
      });
      s.addEventListener("wheel", function (ev) {
        if (!D) return;
        ev.preventDefault();
        var c = indexAt(svgX(ev)), f = ev.deltaY < 0 ? 1 / 1.5 : 1.5;
        var a = Math.round(c - (c - win[0]) * f), b = Math.round(c + (win[1] - c) * f);
        zoom(Math.max(0, a), Math.min(n, Math.max(b, a + 2)));
      }, {passive: false});
    }

    function zoom(a, b) {
      a = Math.max(0, Math.floor(a)); b = Math.min(n, Math.ceil(b));
      if (b - a < 2) b = Math.min(n, a + 2);
      var w = windowRows(D, a, b, W - L - R);
      return draw(w.idx, w.rows, a, b, w.low);
    }
    out.addEventListener("click", function () { var c = (win[0] + win[1]) / 2, hw = (win[1] - win[0]) * 2; zoom(c - hw, c + hw); });
    all.addEventListener("click", function () { zoom(0, n); });

    draw(tl.idx, tl.levels, 0, n, tl.low);
    window.memqZoom = null;
    if (tl.detail && typeof DecompressionStream !== "undefined") {
      unpackDetail(tl.detail).then(function (d) {
        D = d;
        window.memqZoom = zoom;
        box.setAttribute("data-detail", "ready");
        if (win[0] === 0 && win[1] === n) draw(tl.idx, tl.levels, 0, n, tl.low); else zoom(win[0], win[1]);
      }).catch(function (e) { info.textContent = "full detail unavailable: " + e; box.setAttribute("data-detail", "failed"); });
    }
  }

  function segmentMap(box, view, panel) {
    var segs = view.segments;
    if (!segs) { h("p", "note", box, view.blob_error ? "The segment map needs the raw snapshot, which cannot be read." : "no segments"); return; }
    if (!segs.length) { h("p", "note", box, "The allocator held no segments."); return; }
    var W = Math.max(360, box.clientWidth || 700), RH = 26, GAP = 4;
    var total = 0, maxSeg = 0;
    segs.forEach(function (s) { total += s.size; maxSeg = Math.max(maxSeg, s.size); });
    var scale = W / Math.max(maxSeg, total / 24);
    var lay = [], cx = 0, row = 0;
    segs.forEach(function (s) {
      var w = Math.max(4, s.size * scale);
      if (cx > 0 && cx + w > W) { row++; cx = 0; }
      lay.push([cx, row, w]); cx += w + GAP;
    });
    var fit = view.fit, need = fit ? fit.requested_bytes : null;
    var largest = null;
    segs.forEach(function (s, si) { s.blocks.forEach(function (b, bi) { if (b.st === "inactive" && (!largest || b.s > largest[2])) largest = [si, bi, b.s]; }); });
    var svg = svgFor(box, W, (row + 1) * (RH + GAP) + 34);
    svg.setAttribute("id", "segmap-svg");
    scaleBar(svg, 2, (row + 1) * (RH + GAP) + 16, scale, W - 4);
    segs.forEach(function (s, si) {
      var L = lay[si], y0 = L[1] * (RH + GAP) + 2;
      var g = el("g", {"class": "segment" + (s.private ? " private" : "")}, svg);
      el("rect", {x: L[0], y: y0, width: L[2], height: RH, "class": "seg-outline"}, g);
      var sc = L[2] / s.size;
      s.blocks.forEach(function (b, bi) {
        var cls = b.st === "inactive" ? (b.x ? "block stranded" : "block free") : "block cat-" + (b.c || "unknown") + (b.st !== "active_allocated" ? " pending" : "");
        if (largest && largest[0] === si && largest[1] === bi) cls += " largest-free";
        el("rect", {x: (L[0] + b.o * sc).toFixed(2), y: y0 + 2, width: Math.max(1, b.s * sc).toFixed(2), height: RH - 4,
                    "class": cls, "data-si": si, "data-bi": bi}, g);
      });
    });
    if (view.segments_omitted) {
      var om = view.segments_omitted;
      h("p", "note", box, om.segments + " smaller segments (" + fmtBytes(om.bytes) + ", " + om.blocks +
        " blocks) are not drawn: the map shows the largest " + segs.length);
    }
    var readout = h("p", "readout", box, "");
    readout.id = "seg-readout";
    svg.addEventListener("mousemove", function (ev) {
      var t = ev.target;
      if (!t.getAttribute || t.getAttribute("data-bi") === null) { readout.textContent = ""; return; }
      var s = segs[+t.getAttribute("data-si")], b = s.blocks[+t.getAttribute("data-bi")];
      readout.textContent = fmtBytes(b.s) + " " + (b.st === "inactive" ? (b.x ? "stranded free" : "free") : (b.c || "unknown").replace(/_/g, " ")) +
        (b.v ? " (" + originOf(view, b.v) + ")" : "") +
        " at 0x" + (s.address + b.o).toString(16) + " in a " + fmtBytes(s.size) + " " + s.pool + " segment";
    });
    svg.addEventListener("click", function (ev) {
      var t = ev.target;
      if (!t.getAttribute || t.getAttribute("data-bi") === null) return;
      var prev = svg.querySelector(".selected"); if (prev) prev.classList.remove("selected");
      t.classList.add("selected");
      var s = segs[+t.getAttribute("data-si")], b = s.blocks[+t.getAttribute("data-bi")];
      var lines = ["size " + fmtBytes(b.s) + " (requested " + fmtBytes(b.r) + ")", "state " + b.st + (b.x ? " · stranded free bytes" : ""),
                   "category " + (b.c ? b.c.replace(/_/g, " ") : "(free)") + (b.v && view.source_words ? ": " + view.source_words[b.v] : ""),
                   "address 0x" + (s.address + b.o).toString(16),
                   "segment " + fmtBytes(s.size) + " · " + s.pool + " pool · stream " + s.stream + (s.private ? " · private pool" : "")];
      if (need && b.st === "inactive") lines.push(b.s >= need ? "the failed request (" + fmtBytes(need) + ") fits here" : "the failed request (" + fmtBytes(need) + ") does not fit here");
      if (b.kt) lines.push("frames: those of the trace's allocation of this block (the snapshot lists none for it)");
      showFrames(panel, "block of " + fmtBytes(b.s), lines, b.k >= 0 ? view.stacks[b.k] : null);
    });
  }

  /* A size axis for a map drawn at `pxPerByte`: the largest round size that fits in `maxPx`. */
  function scaleBar(svg, x0, y0, pxPerByte, maxPx) {
    var v = 1024;
    while (v * 4 * pxPerByte <= maxPx && v < Math.pow(2, 50)) v *= 4;
    while (v * pxPerByte > maxPx && v > 1) v /= 2;
    var w = v * pxPerByte;
    el("path", {d: "M" + x0 + "," + (y0 - 4) + "v4h" + w.toFixed(1) + "v-4", "class": "scale"}, svg);
    el("text", {x: x0 + w / 2, y: y0 + 12, "class": "tick", "text-anchor": "middle", id: "segmap-scale"}, svg, fmtBytes(v));
  }

  function fitTest(box, fit, comp) {
    var W = Math.max(480, box.clientWidth || 900), H = 160, L = 190, R = 20;
    var svg = svgFor(box, W, H);
    svg.setAttribute("id", "fit-svg");
    var S = fit.requested_bytes || 0, A = fit.active_bytes || 0, LF = fit.largest_usable_free_block_bytes || fit.largest_free_block_bytes || 0;
    var top = Math.max(S, LF, A + S, fit.limit_bytes || 0, fit.reserved_bytes || 0) * 1.02 || 1;
    var x = function (v) { return L + v / top * (W - L - R); };
    el("text", {x: L - 8, y: 30, "class": "tick", "text-anchor": "end"}, svg, "largest usable free block");
    el("rect", {x: L, y: 16, width: Math.max(1, x(LF) - L), height: 18, "class": "block free"}, svg);
    el("rect", {x: L, y: 38, width: Math.max(1, x(S) - L), height: 10, "class": "request"}, svg);
    el("text", {x: Math.max(x(S), x(LF)) + 6, y: 34, "class": "label " + (fit.fits_largest_free_block ? "ok" : "bad")}, svg,
       fmtBytes(LF) + " free vs " + fmtBytes(S) + " requested: " + (fit.fits_largest_free_block ? "fits" : "does not fit"));
    el("text", {x: L - 8, y: 92, "class": "tick", "text-anchor": "end"}, svg, "live + request vs limit");
    // the live bytes by class (the composition's, block by block the segment map's), not one colour
    var ct = 0; CATS.forEach(function (c) { ct += (comp && comp[c]) || 0; });
    if (ct > 0) {
      var cx = L;
      CATS.forEach(function (c) {
        var w = (comp[c] || 0) / ct * (x(A) - L); if (w <= 0) return;
        el("title", {}, el("rect", {x: cx, y: 78, width: Math.max(0.5, w), height: 20, "class": "block live cat-" + c}, svg),
           c + " " + fmtBytes(comp[c]));
        cx += w;
      });
    } else {
      el("rect", {x: L, y: 78, width: Math.max(1, x(A) - L), height: 20, "class": "block live cat-unknown"}, svg);
    }
    el("rect", {x: x(A), y: 78, width: Math.max(1, x(A + S) - x(A)), height: 20, "class": "request"}, svg);
    if (fit.limit_bytes) {
      el("line", {x1: x(fit.limit_bytes), x2: x(fit.limit_bytes), y1: 66, y2: 108, "class": "limit"}, svg);
      wrapped(svg, L, 126, W - 8 - L, "label " + (fit.fits_if_compacted ? "ok" : "bad"),
         fmtBytes(A) + " live + " + fmtBytes(S) + " = " + fmtBytes(A + S) + (fit.fits_if_compacted ? " fits " : " exceeds ") +
         "the limit of " + fmtBytes(fit.limit_bytes) + (fit.limit_source ? " (" + fit.limit_source + ")" : "") +
         (fit.fits_if_compacted ? ": a compacted cache would have served it" : ": no allocator setting makes it fit"));
    } else {
      wrapped(svg, L, 126, W - 8 - L, "label", fmtBytes(A) + " live + " + fmtBytes(S) + " requested; the limit is unknown (memq reanalyze --run RUN --limit SIZE gives it) so whether a compacted cache fits is open");
    }
  }

  /* A label that wraps onto a second line (at ": " or "; ") where the chart is too narrow for it. */
  function wrapped(svg, x, y, width, cls, text) {
    var parts = [text];
    if (text.length * 6.6 > width) {
      var k = Math.max(text.lastIndexOf(": "), text.lastIndexOf("; "));
      if (k > 0) parts = [text.slice(0, k + 1), text.slice(k + 2)];
    }
    parts.forEach(function (t, i) { el("text", {x: x, y: y + 15 * i, "class": cls}, svg, t); });
  }

  function stackedBar(svg, x0, y0, width, height, comp, label, origin) {
    var total = 0; CATS.forEach(function (c) { total += comp[c] || 0; });
    el("text", {x: x0 - 8, y: y0 + height / 2 + 4, "class": "tick", "text-anchor": "end"}, svg, label);
    var cx = x0;
    CATS.forEach(function (c) {
      var v = comp[c] || 0; if (!v) return;
      var w = v / (total || 1) * width;
      var r = el("rect", {x: cx, y: y0, width: Math.max(1, w), height: height, "class": "cat-" + c}, svg);
      el("title", {}, r, c + " " + fmtBytes(v) + (origin && origin[c] ? " · " + originWords(origin[c]) : ""));
      if (w > 70) el("text", {x: cx + 4, y: y0 + height / 2 + 4, "class": "inbar"}, svg, c.replace("_", " ") + " " + fmtBytes(v));
      cx += w;
    });
    return total;
  }

  /* Where one block's class came from, by its source (the server's provenance.origin of each source). */
  function originOf(view, v) {
    return (view.source_origins || {})[v] || "inferred from the trace";
  }

  /* One class's bytes by origin in words (provenance.origin_words). */
  function originWords(o) {
    if (!o) return "";
    var names = ["known from the job", "inferred from the trace", "inferred from the trace's order",
      "inferred from sizes and addresses"];
    var got = names.filter(function (n) { return o[n]; });
    if (!got.length) return "";
    if (got.length === 1) return got[0];
    var total = got.reduce(function (t, n) { return t + o[n]; }, 0);
    return got.slice(0, -1).map(function (n) { return Math.round(100 * o[n] / total) + "% " + n; }).join(", ") +
      ", the rest " + got[got.length - 1];
  }

  function composition(box, comp, origin) {
    if (!comp) { h("p", "note", box, "no composition stored"); return; }
    var W = Math.max(480, box.clientWidth || 900);
    var svg = svgFor(box, W, 50);
    stackedBar(svg, 100, 10, W - 120, 28, comp, "live bytes", origin);
    if (!origin) return;
    // where each class came from, beside the bar: the same block classes as the segment map's
    var by = {};
    CATS.forEach(function (c) { if (comp[c]) { var w = originWords(origin[c]); if (w) (by[w] = by[w] || []).push(c.replace("_", " ")); } });
    var p = h("p", "note", box, "");
    p.id = "composition-origin";
    p.textContent = Object.keys(by).map(function (w) { return by[w].join(", ") + ": " + w; }).join(" · ");
  }

  function compareChart(box, doc) {
    var A = doc.a.composition, B = doc.b.composition;
    if (!A || !B) return;
    var W = Math.max(480, box.clientWidth || 900), L = 140, R = 20;
    var ta = 0, tb = 0; CATS.forEach(function (c) { ta += A[c] || 0; tb += B[c] || 0; });
    var m = Math.max(ta, tb) || 1;
    var svg = svgFor(box, W, 90);
    stackedBar(svg, L, 10, (W - L - R) * ta / m, 28, A, doc.a.run);
    stackedBar(svg, L, 50, (W - L - R) * tb / m, 28, B, doc.b.run);
  }

  /* ------------------------------------------------------------------------------ dispatch */
  var box;
  if ((box = document.getElementById("timeline")) && DATA) {
    var dom = runTimeline(box, DATA.history, DATA.lanes);
    var lanesBox = document.getElementById("lanes");
    if (lanesBox) runLanes(lanesBox, DATA.lanes, dom);
  }
  var panel = document.getElementById("frames");
  if ((box = document.getElementById("cat-timeline")) && DATA) catTimeline(box, DATA, panel);
  if ((box = document.getElementById("segmap")) && DATA) segmentMap(box, DATA, panel);
  if ((box = document.getElementById("fit")) && DATA && DATA.fit) fitTest(box, DATA.fit, DATA.composition);
  if ((box = document.getElementById("composition")) && DATA) composition(box, DATA.composition, DATA.composition_origin);
  if ((box = document.getElementById("compare-chart")) && DATA) compareChart(box, DATA);
  document.documentElement.setAttribute("data-ready", "1");
})();
