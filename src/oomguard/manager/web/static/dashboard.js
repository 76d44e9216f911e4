// Auto-refresh the live part of a page without a full reload. The server renders the HTML
// (escaped there); this script only swaps it in. No inline script anywhere: the CSP forbids it.
// Only #live is replaced: the filter box, the status select and anything typed there stay; the
// scroll position, the focused link and which alert groups are open are kept across the swap.
// "Updated N s ago" counts from the last successful refresh; a banner says when the manager
// cannot be reached or the session has expired, so stale numbers never pass for live ones.
(function () {
  "use strict";
  var live = document.getElementById("live");
  if (!live) { return; }
  var seconds = parseInt(live.getAttribute("data-refresh") || "15", 10);
  var updated = document.getElementById("updated");
  var banner = document.getElementById("banner");
  var lastOk = Date.now();

  function age() { return Math.max(0, Math.round((Date.now() - lastOk) / 1000)); }

  function tick() { if (updated) { updated.textContent = age() + " s ago"; } }

  function say(text, link) {
    if (!banner) { return; }
    banner.textContent = text;
    if (link) {
      var a = document.createElement("a");
      a.href = "/login?next=" + encodeURIComponent(window.location.pathname + window.location.search);
      a.textContent = link;
      banner.appendChild(document.createTextNode(" "));
      banner.appendChild(a);
    }
    banner.hidden = false;
  }

  function remember() {
    var active = document.activeElement;
    var open = [];
    live.querySelectorAll("details[open] > summary b").forEach(function (b) { open.push(b.textContent); });
    var box = live.querySelector(".scroll");
    return {
      x: window.scrollX, y: window.scrollY, left: box ? box.scrollLeft : 0, open: open,
      href: active && live.contains(active) ? active.getAttribute("href") : null
    };
  }

  function restore(state) {
    live.querySelectorAll("details").forEach(function (d) {
      var b = d.querySelector("summary b");
      d.open = !!b && state.open.indexOf(b.textContent) >= 0;
    });
    var box = live.querySelector(".scroll");
    if (box) { box.scrollLeft = state.left; }
    if (state.href) {
      var same = Array.prototype.find.call(live.querySelectorAll("a[href]"), function (a) {
        return a.getAttribute("href") === state.href;
      });
      if (same) { same.focus({ preventScroll: true }); }
    }
    window.scrollTo(state.x, state.y);
  }

  function swap(html) {
    var state = remember();
    live.innerHTML = html;
    restore(state);
    lastOk = Date.now();
    tick();
    if (banner) { banner.hidden = true; }
  }

  function refresh() {
    var url = new URL(window.location.href);
    url.searchParams.set("fragment", "1");
    fetch(url.toString(), { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (r) {
        if (r.status === 401 || (r.redirected && new URL(r.url).pathname === "/login")) {
          say("Your session has expired; the numbers below are from " + age() + " s ago.", "Sign in again");
          return null;
        }
        if (!r.ok) {
          say("The manager answered " + r.status + "; the numbers below are from " + age() + " s ago.");
          return null;
        }
        return r.text();
      })
      .then(function (html) { if (html !== null) { swap(html); } })
      .catch(function () {
        say("Cannot reach the manager; the numbers below are from " + age() + " s ago.");
      });
  }

  window.setInterval(refresh, seconds * 1000);
  window.setInterval(tick, 1000);
  tick();
}());
