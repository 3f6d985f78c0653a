// The console's charts (uPlot) and small behaviours; no inline script (the page's CSP forbids it).
(function () {
  "use strict";
  const palette = ["#2563eb", "#dc2626", "#16a34a", "#d97706", "#7c3aed", "#0891b2", "#db2777", "#65a30d"];
  const plots = {};

  function refreshSeconds() {
    const value = parseFloat(document.body.dataset.refresh || "2");
    return isFinite(value) && value > 0 ? value : 2;
  }

  function options(chart, width) {
    return {
      width: width,
      height: 180,
      legend: { show: true },
      scales: { x: { time: true } },
      axes: [{}, { label: chart.unit, size: 60 }],
      series: [{}].concat(chart.series.map(function (name, i) {
        return { label: name, stroke: palette[i % palette.length], width: 1.5, spanGaps: true };
      })),
    };
  }

  function draw(chart) {
    const figure = document.querySelector('.chart[data-chart="' + chart.id + '"]');
    if (!figure || typeof uPlot === "undefined") return;
    const target = figure.querySelector(".plot");
    const width = Math.max(240, Math.floor(figure.getBoundingClientRect().width) - 8);
    const known = plots[chart.id];
    const key = chart.series.join("|");
    if (known && known.key === key) {
      known.plot.setData(chart.data);
      return;
    }
    if (known) known.plot.destroy();
    target.textContent = "";
    plots[chart.id] = { key: key, plot: new uPlot(options(chart, width), chart.data, target) };
    figure.dataset.series = String(chart.series.length);
  }

  function load() {
    if (!document.querySelector(".chart")) return;
    fetch("/api/charts.json", { headers: { Accept: "application/json" }, cache: "no-store" })
      .then(function (response) { return response.ok ? response.json() : null; })
      .then(function (body) { if (body) body.charts.forEach(draw); })
      .catch(function () { /* the next refresh tries again */ });
  }

  // The start token of a console without browser certificates: given once in the URL this console
  // printed (?token=...), kept for this tab only, taken out of the address bar, and sent with every
  // request htmx makes (the actions refuse a request without it).
  const tokenKey = "waltz-console-token";
  (function keepToken() {
    const params = new URLSearchParams(window.location.search);
    const token = params.get("token");
    if (token) {
      window.sessionStorage.setItem(tokenKey, token);
      params.delete("token");
      const rest = params.toString();
      window.history.replaceState(null, "", window.location.pathname + (rest ? "?" + rest : "") + window.location.hash);
    }
  })();

  document.addEventListener("htmx:configRequest", function (event) {
    const token = window.sessionStorage.getItem(tokenKey);
    if (token && event.detail.verb === "post") event.detail.headers["X-Console-Token"] = token;
  });

  document.addEventListener("click", function (event) {
    const button = event.target.closest("[data-clear]");
    if (button) {
      const target = document.querySelector(button.dataset.clear);
      if (target) target.textContent = "";
    }
  });

  window.addEventListener("resize", function () {
    Object.keys(plots).forEach(function (id) {
      const figure = document.querySelector('.chart[data-chart="' + id + '"]');
      if (figure) {
        const width = Math.max(240, Math.floor(figure.getBoundingClientRect().width) - 8);
        plots[id].plot.setSize({ width: width, height: 180 });
      }
    });
  });

  document.addEventListener("DOMContentLoaded", function () {
    load();
    window.setInterval(load, refreshSeconds() * 1000);
  });
})();
