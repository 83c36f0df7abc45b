/* Your instincts: a scatter per topic of the learner's predictions (y) against the measurements
   (x), on log axes, with the line y = x and the band around it shaded (Chart.js 4.6.1,
   static/vendor). Data comes from the page's json_script. */
(function () {
  "use strict";

  function css(name, fallback) {
    var value = getComputedStyle(document.documentElement).getPropertyValue(name).trim();
    return value || fallback;
  }

  function line(low, high, factor, color, label, fill) {
    return {
      type: "line", label: label, data: [{ x: low, y: low * factor }, { x: high, y: high * factor }],
      borderColor: color, backgroundColor: color, borderWidth: 1, pointRadius: 0, fill: fill,
      order: 2,
    };
  }

  function draw(canvas, data) {
    var text = css("--muted", "#5d636e"), grid = css("--line", "#dfe1e5");
    var good = css("--good", "#1f7a4d"), bad = css("--bad", "#b42318"), accent = css("--accent", "#2c5fd4");
    var low = data.low, high = data.high, band = data.band;
    var shade = "rgba(31, 122, 77, 0.14)";
    var datasets = [
      line(low, high, 1 + band, shade, "band (±" + Math.round(band * 100) + "%)", false),
      line(low, high, Math.max(1 - band, 0.01), shade, "band low", "-1"),
      line(low, high, 1, accent, "y = x", false),
      {
        type: "scatter", label: "your predictions",
        data: data.points.map(function (p) { return { x: p.x, y: p.y, title: p.title, unit: p.unit }; }),
        pointBackgroundColor: data.points.map(function (p) { return p.inside ? good : bad; }),
        pointBorderColor: data.points.map(function (p) { return p.inside ? good : bad; }),
        pointStyle: data.points.map(function (p) { return p.source === "quiz" ? "rect" : "circle"; }),
        pointRadius: 5, order: 1,
      },
    ];
    var axis = function (title) {
      return { type: "logarithmic", min: low, max: high, title: { display: true, text: title, color: text },
        ticks: { color: text, maxTicksLimit: 6 }, grid: { color: grid } };
    };
    var old = window.Chart.getChart(canvas);
    if (old) old.destroy();
    new window.Chart(canvas, {
      data: { datasets: datasets },
      options: {
        responsive: true, maintainAspectRatio: false, animation: false,
        scales: { x: axis("measured"), y: axis("yours") },
        plugins: {
          legend: { labels: { color: text, boxWidth: 10, filter: function (item) { return item.text !== "band low"; } } },
          tooltip: { callbacks: { label: function (ctx) {
            var p = ctx.raw;
            return p.title ? p.title + ": yours " + p.y.toPrecision(3) + " " + p.unit + ", measured " + p.x.toPrecision(3) + " " + p.unit : "";
          } } },
        },
      },
    });
  }

  function init() {
    var el = document.getElementById("instinct-charts");
    if (!el || !window.Chart) return;
    var charts = JSON.parse(el.textContent);
    document.querySelectorAll("canvas[data-instinct]").forEach(function (canvas) {
      var data = charts[canvas.dataset.instinct];
      if (data) draw(canvas, data);
    });
  }

  document.addEventListener("DOMContentLoaded", init);
})();
