// fleetpace dashboard: live refresh and countdowns. Everything works
// without this script; it only refreshes the page in place every few
// seconds (not while a form is being filled in) and ticks the countdowns.
(function () {
  "use strict";
  var body = document.body;
  document.documentElement.classList.add("js");
  var skew = Number(body.dataset.now) - Date.now(); // server clock − ours

  function fmt(ms) {
    var s = Math.round(ms / 1000);
    if (s < 60) return s + "s";
    if (s < 3600) {
      var m = Math.floor(s / 60), r = s % 60;
      return r ? m + "m" + (r < 10 ? "0" : "") + r + "s" : m + "m";
    }
    var h = Math.floor(s / 3600), mm = Math.round((s % 3600) / 60);
    return mm ? h + "h" + (mm < 10 ? "0" : "") + mm + "m" : h + "h";
  }

  function tick() {
    var now = Date.now() + skew;
    document.querySelectorAll("[data-until]").forEach(function (el) {
      var left = Number(el.dataset.until) - now;
      el.textContent = left > 0 ? fmt(left) : "0s";
    });
  }

  // busy: the user is typing into, or has changed, a form in the page.
  function busy() {
    var a = document.activeElement;
    if (a && a.matches && a.matches("#main input, #main select, #main textarea")) return true;
    var fields = document.querySelectorAll("#main input, #main select");
    for (var i = 0; i < fields.length; i++) {
      var f = fields[i];
      if (f.tagName === "SELECT") {
        if (f.selectedIndex >= 0 && !f.options[f.selectedIndex].defaultSelected && f.selectedIndex !== 0) return true;
      } else if (f.type !== "hidden" && f.value !== f.defaultValue) {
        return true;
      }
    }
    return false;
  }

  var refreshing = false;
  function refresh() {
    if (refreshing || document.hidden || busy()) return;
    refreshing = true;
    fetch(location.href, { credentials: "same-origin", headers: { "X-Fleetpace-Refresh": "1" } })
      .then(function (res) { return res.text(); })
      .then(function (html) {
        var doc = new DOMParser().parseFromString(html, "text/html");
        var next = doc.getElementById("main");
        if (next && !busy()) {
          document.getElementById("main").replaceWith(document.adoptNode(next));
          skew = Number(doc.body.dataset.now) - Date.now();
          tick();
        }
      })
      .catch(function () {})
      .finally(function () { refreshing = false; });
  }

  // The notice of an action is shown once, not on every refresh.
  if (location.search.indexOf("done=") >= 0 && history.replaceState) {
    var u = new URL(location.href);
    u.searchParams.delete("done");
    history.replaceState(null, "", u.pathname + u.search + u.hash);
  }
  tick();
  setInterval(tick, 1000);
  var every = Number(body.dataset.refresh);
  if (every > 0) setInterval(refresh, every);
})();
