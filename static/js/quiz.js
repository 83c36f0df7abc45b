/* Serving School quiz: keyboard shortcuts, focus after htmx swaps, stats charts, browser time zone.
 * Everything here is an enhancement; the quiz pages are plain forms without it. */
(function () {
  "use strict";

  function panel() {
    return document.getElementById("quiz-panel");
  }

  function press(el) {
    if (el && !el.disabled) {
      // A key can land between htmx swapping new content in and wiring it up; wire the form now
      // (htmx.process is idempotent) so the click goes through htmx, not a full-page post.
      if (el.form && window.htmx) window.htmx.process(el.form);
      el.click();
      return true;
    }
    return false;
  }

  function isTyping(target) {
    if (!target || !target.tagName) return false;
    const tag = target.tagName;
    return tag === "INPUT" || tag === "TEXTAREA" || tag === "SELECT" || target.isContentEditable;
  }

  // Anki's keys: Space/Enter show the answer, then Space/Enter takes the suggested grade (Good,
  // or Again after a wrong pick); 1-4 grade; options by digit or letter; u undoes.
  function onKey(event) {
    const root = panel();
    if (!root || event.ctrlKey || event.metaKey || event.altKey || event.isComposing) return;
    if (event.target && event.target.id === "answer-value") {
      onNumberBoxKey(event, root);
      return;
    }
    if (isTyping(event.target)) return; // Enter in the number box submits its own form
    const key = event.key;
    const side = root.dataset.side;
    const activate = key === " " || key === "Enter";
    // Enter/Space on a focused link or button already activates it; do not do it twice.
    if (activate && event.target.closest && event.target.closest("a, button, summary")) return;
    let handled = false;

    if (key === "u" || key === "U") {
      handled = press(root.querySelector("[data-undo]"));
    } else if (side === "question") {
      if (activate) {
        handled = press(root.querySelector("[data-reveal]"));
      } else if (root.dataset.kind === "choice") {
        let index = -1;
        if (/^[1-6]$/.test(key)) index = Number(key);
        else if (/^[a-fA-F]$/.test(key)) index = key.toLowerCase().charCodeAt(0) - 96;
        if (index > 0) handled = press(root.querySelector('[data-option="' + index + '"]'));
      } else if (root.dataset.kind === "numeric" && /^[0-9.,-]$/.test(key)) {
        const input = root.querySelector("#answer-value");
        if (input) input.focus(); // the key itself then lands in the box
      }
    } else if (side === "answer") {
      if (activate) handled = press(root.querySelector("[data-suggested]"));
      else if (/^[1-4]$/.test(key)) handled = press(root.querySelector('[data-rating="' + key + '"]'));
    }
    if (handled) event.preventDefault();
  }

  // The number box has the focus on a numeric card, so the page's keys must work in it too: no
  // number holds a "u", so u undoes; Space in the empty box shows the answer (after a digit it
  // stays a thousands separator, "1 748"). Enter submits the box's own form, which checks.
  function onNumberBoxKey(event, root) {
    let handled = false;
    if (event.key === "u" || event.key === "U") {
      press(root.querySelector("[data-undo]"));
      handled = true; // never typed: it cannot be part of a number
    } else if (event.key === " " && event.target.value.trim() === "") {
      handled = press(root.querySelector("[data-reveal]"));
    } else if (event.key === "Enter" && event.target.form && window.htmx) {
      // As in press(): a box typed into right after the swap may not be wired yet, and its
      // Enter would post the whole page (seen in CI on a loaded machine). keydown comes before
      // the submit, so wiring it now sends the submit through htmx.
      window.htmx.process(event.target.form);
    }
    if (handled) event.preventDefault();
  }

  // After each swap, put focus where the next key is expected, without scrolling the page around.
  function focusPanel() {
    const root = panel();
    if (!root) return;
    const input = root.querySelector("[data-autofocus]");
    if (input) input.focus({ preventScroll: true });
    else if (!isTyping(document.activeElement)) root.focus({ preventScroll: true });
  }

  document.addEventListener("keydown", onKey);
  // After a swap: the question starts at the top of the panel; on the answer side, jump to the
  // verdict (or the answer), which a long prompt would otherwise push below the fold on a phone.
  function placeView() {
    const root = panel();
    if (!root) return;
    const target =
      root.dataset.side === "answer"
        ? root.querySelector("[data-verdict]") || root.querySelector("[data-answer]")
        : root;
    if (target && target.getBoundingClientRect().top < 0) target.scrollIntoView({ block: "start" });
    else if (target && target.getBoundingClientRect().top > window.innerHeight * 0.55) {
      target.scrollIntoView({ block: "start" });
    }
  }

  document.addEventListener("htmx:afterSettle", function (event) {
    if (event.target && event.target.id === "quiz-panel") {
      focusPanel();
      placeView();
    }
  });
  // A failure htmx does not swap (403, 404, 500, offline): say so instead of doing nothing.
  document.addEventListener("htmx:responseError", function (event) {
    showProblem("That did not work (" + event.detail.xhr.status + "). Reload the page to continue.");
  });
  document.addEventListener("htmx:sendError", function () {
    showProblem("The server could not be reached. Check the connection and try again.");
  });

  function showProblem(text) {
    const root = panel();
    if (!root) return;
    let box = root.querySelector(".quiz-problem");
    if (!box) {
      box = document.createElement("p");
      box.className = "quiz-notice quiz-problem";
      box.setAttribute("role", "alert");
      root.prepend(box);
    }
    box.textContent = text;
  }

  // --- Settings: offer the browser's time zone ---------------------------------------------------
  function offerBrowserZone() {
    const hint = document.getElementById("tz-hint");
    const select = document.getElementById("id_time_zone");
    if (!hint || !select) return;
    let zone = "";
    try {
      zone = Intl.DateTimeFormat().resolvedOptions().timeZone || "";
    } catch (e) {
      return;
    }
    if (!zone || zone === select.value || !select.querySelector('option[value="' + zone + '"]')) return;
    const button = hint.querySelector("[data-use-browser-zone]");
    button.textContent = zone.replace(/_/g, " ");
    button.addEventListener("click", function () {
      select.value = zone;
      hint.hidden = true;
    });
    hint.hidden = false;
  }

  // --- Stats charts -------------------------------------------------------------------------------
  function cssVar(name, fallback) {
    const value = getComputedStyle(document.documentElement).getPropertyValue(name).trim();
    return value || fallback;
  }

  function shortDay(iso) {
    const parts = iso.split("-");
    return Number(parts[2]) + "/" + Number(parts[1]);
  }

  function drawCharts() {
    const node = document.getElementById("stats-data");
    if (!node || !window.Chart) return;
    const data = JSON.parse(node.textContent);
    const accent = cssVar("--accent", "#2c5fd4");
    const bad = cssVar("--bad", "#b42318");
    const good = cssVar("--good", "#1f7a4d");
    const muted = cssVar("--muted", "#5d636e");
    const line = cssVar("--line", "#dfe1e5");
    Chart.defaults.color = muted;
    Chart.defaults.borderColor = line;
    Chart.defaults.font.family = getComputedStyle(document.body).fontFamily;
    const base = {
      responsive: true,
      maintainAspectRatio: false,
      animation: false,
      plugins: { legend: { position: "bottom", labels: { boxWidth: 12 } } },
      scales: { x: { grid: { display: false }, ticks: { maxRotation: 0, autoSkipPadding: 8 } } },
    };
    // The last day is today; weekly labels counted back from it, so today's bar has its own
    // label under it (Chart.js's auto-skip counts from the first day and could leave it bare).
    const days = data.days.map(function (d, i) {
      return i === data.days.length - 1 ? "today" : shortDay(d);
    });
    const weeklyFromToday = Object.assign({}, base.scales.x, {
      ticks: {
        maxRotation: 0,
        autoSkip: false,
        callback: function (value, index) {
          return (days.length - 1 - index) % 7 === 0 ? this.getLabelForValue(value) : null;
        },
      },
    });

    new Chart(document.getElementById("chart-reviews"), {
      type: "bar",
      data: {
        labels: days,
        datasets: [
          {
            label: "Passed",
            data: data.reviews.map(function (n, i) { return n - data.again[i]; }),
            backgroundColor: accent,
            stack: "r",
          },
          { label: "Again", data: data.again, backgroundColor: bad, stack: "r" },
        ],
      },
      options: Object.assign({}, base, {
        scales: Object.assign({}, base.scales, {
          x: Object.assign({}, weeklyFromToday, { stacked: true }),
          y: { stacked: true, beginAtZero: true, ticks: { precision: 0 } },
        }),
      }),
    });

    const retention = document.getElementById("chart-retention");
    if (retention) new Chart(retention, {
      type: "line",
      data: {
        labels: days,
        datasets: [
          {
            label: "True retention",
            data: data.retention,
            borderColor: good,
            backgroundColor: good,
            spanGaps: true,
            tension: 0.2,
            clip: false,
          },
          {
            label: "Desired",
            data: days.map(function () { return data.desired; }),
            borderColor: muted,
            borderDash: [6, 4],
            pointRadius: 0,
            borderWidth: 1.5,
          },
        ],
      },
      options: Object.assign({}, base, {
        scales: Object.assign({}, base.scales, {
          x: weeklyFromToday,
          y: {
            suggestedMin: 0.5,
            max: 1,
            ticks: { callback: function (v) { return Math.round(v * 100) + "%"; } },
          },
        }),
      }),
    });

    new Chart(document.getElementById("chart-forecast"), {
      type: "bar",
      data: {
        labels: data.forecastDays.map(function (d, i) { return i === 0 ? "today" : shortDay(d); }),
        datasets: [{ label: "Cards due", data: data.forecast, backgroundColor: accent }],
      },
      options: Object.assign({}, base, {
        plugins: { legend: { display: false } },
        scales: Object.assign({}, base.scales, {
          y: { beginAtZero: true, ticks: { precision: 0 } },
        }),
      }),
    });

    const tags = document.getElementById("chart-tags");
    if (tags) {
      new Chart(tags, {
        type: "bar",
        data: {
          labels: data.tags,
          datasets: [
            {
              label: "Passed",
              data: data.tagPass,
              backgroundColor: data.tagPass.map(function (p) {
                return p < data.desired ? bad : good;
              }),
            },
          ],
        },
        options: Object.assign({}, base, {
          indexAxis: "y",
          plugins: {
            legend: { display: false },
            tooltip: {
              callbacks: {
                label: function (ctx) {
                  return Math.round(ctx.raw * 100) + "% of " + data.tagReviews[ctx.dataIndex];
                },
              },
            },
          },
          scales: {
            x: {
              min: 0,
              max: 1,
              ticks: { callback: function (v) { return Math.round(v * 100) + "%"; } },
            },
            y: { grid: { display: false } },
          },
        }),
      });
    }
  }

  // Back from another page can restore this one from the back/forward cache, panel and all, as it
  // was when the learner left; the quiz has moved on since (or was answered in another tab).
  // Fetch it again. (The server also sends no-store, so a plain Back reloads anyway.)
  window.addEventListener("pageshow", function (event) {
    if (event.persisted && panel()) window.location.reload();
  });

  document.addEventListener("DOMContentLoaded", function () {
    document.documentElement.dataset.quiz = "ready"; // lets browser tests wait for the keys
    focusPanel();
    offerBrowserZone();
    drawCharts();
  });
})();
