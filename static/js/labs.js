/* Lab charts (Chart.js 4.6.1, static/vendor). Data comes from json_script tags the pages render;
   charts are (re)drawn whenever htmx loads content, so a result swapped in by polling draws too. */
(function () {
  "use strict";

  function css(name, fallback) {
    var value = getComputedStyle(document.documentElement).getPropertyValue(name).trim();
    return value || fallback;
  }

  function palette() {
    return {
      text: css("--muted", "#5d636e"),
      grid: css("--line", "#dfe1e5"),
      accent: css("--accent", "#2c5fd4"),
      warn: css("--warn", "#9a6700"),
      good: css("--good", "#1f7a4d"),
      bad: css("--bad", "#b42318"),
    };
  }

  function readJSON(id) {
    var el = document.getElementById(id);
    return el ? JSON.parse(el.textContent) : null;
  }

  function draw(canvas, config) {
    var old = window.Chart.getChart(canvas);
    if (old) old.destroy();
    return new window.Chart(canvas, config);
  }

  function baseOptions(p, xTitle, yTitle, animate) {
    return {
      responsive: true,
      maintainAspectRatio: false,
      animation: animate ? undefined : false,
      plugins: { legend: { labels: { color: p.text, usePointStyle: true, boxWidth: 7, boxHeight: 7 } } },
      scales: {
        x: { title: { display: true, text: xTitle, color: p.text }, ticks: { color: p.text, maxRotation: 0, autoSkipPadding: 8 }, grid: { color: p.grid } },
        y: { title: { display: true, text: yTitle, color: p.text }, ticks: { color: p.text }, grid: { color: p.grid }, beginAtZero: true },
      },
    };
  }

  function fmtMs(ms) {
    if (ms >= 1000) return (ms / 1000).toPrecision(2) + " s";
    if (ms >= 10) return Math.round(ms) + " ms";
    return ms.toPrecision(2) + " ms";
  }

  // Samples in seconds -> a histogram in milliseconds. The range stops at the 99th percentile so
  // a few stragglers (a preempted request's long gap) do not squash everything into one bar;
  // they are counted in the last bar, labelled "≥".
  function histogram(samples, bins) {
    var ms = samples.map(function (s) { return s * 1000; }).sort(function (a, b) { return a - b; });
    if (!ms.length) return { labels: [], counts: [] };
    var lo = ms[0], max = ms[ms.length - 1], hi = ms[Math.floor(0.99 * (ms.length - 1))];
    if (hi <= lo) hi = max;
    if (hi === lo) return { labels: [fmtMs(lo)], counts: [ms.length] };
    var width = (hi - lo) / bins, counts = new Array(bins).fill(0);
    ms.forEach(function (v) { counts[Math.max(0, Math.min(bins - 1, Math.floor((v - lo) / width)))] += 1; });
    var labels = counts.map(function (_, i) { return fmtMs(lo + (i + 0.5) * width); });
    if (max > hi) labels[bins - 1] = "≥ " + fmtMs(lo + (bins - 1) * width);
    return { labels: labels, counts: counts };
  }

  function points(xs, ys, scale) {
    return xs.map(function (x, i) { return { x: x, y: ys[i] == null ? null : ys[i] * (scale || 1) }; });
  }

  function histogramChart(canvas, samples, label, p) {
    var h = histogram(samples || [], 30);
    var options = baseOptions(p, label, "share of samples", true);
    options.plugins.legend.display = false;
    var total = h.counts.reduce(function (a, b) { return a + b; }, 0) || 1;
    draw(canvas, {
      type: "bar",
      data: { labels: h.labels, datasets: [{ label: label, data: h.counts.map(function (c) { return c / total; }), backgroundColor: p.accent, barPercentage: 1, categoryPercentage: 1 }] },
      options: options,
    });
  }

  // Which clock the time axis is: the simulator's virtual time, or the client's wall clock.
  function timeAxisTitle(simulated) {
    return simulated ? "simulated time in the run (s), not wall-clock" : "wall-clock time in the run (s)";
  }

  function lineChart(canvas, datasets, yTitle, p, yMax, xTitle) {
    var options = baseOptions(p, xTitle || timeAxisTitle(false), yTitle, true);
    options.scales.x.type = "linear";
    options.elements = { point: { radius: 0 }, line: { borderWidth: 2 } };
    if (yMax) options.scales.y.max = yMax;
    draw(canvas, { type: "line", data: { datasets: datasets }, options: options });
  }

  function runCharts(root) {
    root.querySelectorAll("[data-charts]").forEach(function (box) {
      var data = readJSON(box.dataset.charts);
      if (!data) return;
      var p = palette(), engine = data.engine || { t_s: [] }, tps = data.tokens_per_s || { t_s: [], value: [] };
      var xTitle = timeAxisTitle(data.simulated);
      box.querySelectorAll("canvas[data-chart]").forEach(function (canvas) {
        var kind = canvas.dataset.chart;
        if (kind === "ttft") histogramChart(canvas, data.ttft_s, "TTFT", p);
        if (kind === "itl") histogramChart(canvas, data.itl_s, "ITL", p);
        if (kind === "throughput") {
          lineChart(canvas, [{ label: "output tokens/s", data: points(tps.t_s, tps.value), borderColor: p.accent, backgroundColor: p.accent, stepped: true }], "tokens/s", p, null, xTitle);
        }
        if (kind === "queues") {
          lineChart(canvas, [
            { label: "running", data: points(engine.t_s, engine.running), borderColor: p.accent, backgroundColor: p.accent },
            { label: "waiting", data: points(engine.t_s, engine.waiting), borderColor: p.warn, backgroundColor: p.warn },
          ], "sequences", p, null, xTitle);
        }
        if (kind === "kv") {
          lineChart(canvas, [{ label: "KV cache in use", data: points(engine.t_s, engine.kv_usage, 100), borderColor: p.good, backgroundColor: p.good }], "% of the pool", p, 100, xTitle);
        }
      });
    });
  }

  var SCALE = { s: [1000, "ms"], ratio: [100, "%"] };

  function sweepCharts(root) {
    root.querySelectorAll("[data-sweep]").forEach(function (box) {
      var data = readJSON(box.dataset.sweep);
      if (!data) return;
      var p = palette();
      box.querySelectorAll("canvas[data-metric]").forEach(function (canvas) {
        var metric = data.metrics[Number(canvas.dataset.metric)];
        var scale = SCALE[metric.unit] || [1, metric.unit];
        var measured = metric.points.map(function (pt) { return pt.measured == null ? null : pt.measured * scale[0]; });
        var predicted = metric.points.map(function (pt) { return pt.predicted == null ? null : pt.predicted * scale[0]; });
        var datasets = [{ label: data.simulated ? "measured (simulated on CPU)" : "measured", data: measured, borderColor: p.accent, backgroundColor: p.accent, spanGaps: true }];
        if (predicted.some(function (v) { return v != null; })) {
          datasets.push({ label: "predicted", data: predicted, borderColor: p.warn, backgroundColor: p.warn, borderDash: [6, 4] });
        }
        // Polling redraws every second; animating each redraw would make the lines jump.
        var options = baseOptions(p, data.field, metric.label + (scale[1] ? " (" + scale[1] + ")" : ""), false);
        draw(canvas, { type: "line", data: { labels: data.values, datasets: datasets }, options: options });
      });
    });
  }

  // The CSP refuses style="" attributes; a part's width travels as data-width and is set here
  // through the DOM, which the CSP allows.
  function barWidths(root) {
    (root.querySelectorAll ? root : document).querySelectorAll(".stacked-bar .part[data-width]").forEach(function (part) {
      part.style.width = parseFloat(part.dataset.width) + "%";
    });
  }

  function init(root) {
    barWidths(root);
    if (!window.Chart) return;
    runCharts(root);
    sweepCharts(root);
  }

  if (window.htmx) {
    window.htmx.onLoad(init);
  } else {
    document.addEventListener("DOMContentLoaded", function () { init(document); });
  }
})();
