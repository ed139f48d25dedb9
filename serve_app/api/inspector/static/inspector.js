// Progressive enhancement only: the live figures refresh every 10 s through the public API (the
// session cookie authenticates the GET). With JavaScript blocked the page shows them as rendered.
(function () {
  const stats = document.getElementById("stats");
  if (!stats || !window.fetch) return;
  const read = (data, path) => path.split(".").reduce((v, k) => (v == null ? v : v[k]), data);
  async function refresh() {
    try {
      const response = await fetch("/v1/stats", { credentials: "same-origin", headers: { Accept: "application/json" } });
      if (!response.ok) return;
      const data = await response.json();
      stats.querySelectorAll("[data-stat]").forEach((el) => {
        const value = read(data, el.dataset.stat);
        const unit = el.dataset.unit;
        if (value == null) return;
        el.textContent = unit ? `${Number(value).toFixed(1)} ${unit}` : String(value);
      });
    } catch (_) { /* the next tick tries again */ }
  }
  setInterval(refresh, 10000);
})();
