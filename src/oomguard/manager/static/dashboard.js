// Auto-refresh the live part of a page without a full reload. The server renders the HTML
// (escaped there); this script only swaps it in. No inline script anywhere: the CSP forbids it.
(function () {
  "use strict";
  var live = document.getElementById("live");
  if (!live) { return; }
  var seconds = parseInt(live.getAttribute("data-refresh") || "15", 10);
  function refresh() {
    var url = new URL(window.location.href);
    url.searchParams.set("fragment", "1");
    fetch(url.toString(), { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (r) { return r.ok && !r.redirected ? r.text() : null; })
      .then(function (html) { if (html !== null) { live.innerHTML = html; } })
      .catch(function () { /* offline for a moment: try again at the next tick */ });
  }
  window.setInterval(refresh, seconds * 1000);
}());
