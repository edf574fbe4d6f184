// TMS back office: live regions and confirmations. No framework, no third-party code.
// An element with data-refresh-url is re-fetched every data-refresh-every seconds and its
// content swapped in place (no full reload); refreshing pauses while the tab is hidden and
// stops when the fragment no longer asks for it (e.g. an execution that has finished).
(function () {
  "use strict";

  function schedule(region) {
    var every = parseFloat(region.getAttribute("data-refresh-every") || "5");
    if (!(every > 0)) return;
    region._tmsTimer = window.setTimeout(function () { refresh(region); }, every * 1000);
  }

  function refresh(region) {
    var url = region.getAttribute("data-refresh-url");
    if (!url) return;
    if (document.hidden) { schedule(region); return; }
    fetch(url, { credentials: "same-origin", headers: { "X-Requested-With": "fetch" } })
      .then(function (response) {
        if (response.redirected || !response.ok) throw new Error("refresh answered " + response.status);
        return response.text();
      })
      .then(function (html) {
        region.innerHTML = html;
        latestFirst(region);
        markOverflow(region);
        region.removeAttribute("data-stale");
        var marker = region.querySelector("[data-refresh-stop]");
        if (marker) {
          region.removeAttribute("data-refresh-url");
          keepMessages();
          window.location.reload();  // the run ended: show its final page (buttons change too)
          return;
        }
        region.setAttribute("data-refreshed-at", new Date().toISOString());
        schedule(region);
      })
      .catch(function () { region.setAttribute("data-stale", "true"); schedule(region); });
  }

  // A chart wider than its card (on a phone) scrolls: show its latest minutes, at its right end.
  function latestFirst(root) {
    root.querySelectorAll(".chart-frame.wide").forEach(function (frame) {
      frame.scrollLeft = frame.scrollWidth;
    });
  }

  // A table box whose table is wider than it (a phone) says so in its caption ("scroll sideways
  // for more"); on a screen where the table fits, the hint would be untrue, so it stays hidden.
  function markOverflow(root) {
    root.querySelectorAll(".table-box").forEach(function (box) {
      box.classList.toggle("overflows", box.scrollWidth > box.clientWidth + 1);
    });
  }

  // The phone menu: the button shows and hides the navigation (CSS hides the button on wide screens).
  function menu() {
    var toggle = document.getElementById("menu-toggle");
    var header = toggle && toggle.closest(".topbar");
    if (!header) return;
    header.classList.add("menu-ready");
    toggle.addEventListener("click", function () {
      var open = header.classList.toggle("open");
      toggle.setAttribute("aria-expanded", open ? "true" : "false");
    });
  }

  // The reload when a run ends would drop the message of the action that led here ("Execution
  // 12 retries execution 9."): carry it over to the reloaded page, once.
  var KEPT = "tms-kept-messages";

  function keepMessages() {
    var shown = document.querySelector(".messages");
    try {
      if (shown) window.sessionStorage.setItem(KEPT, JSON.stringify({ path: window.location.pathname, html: shown.outerHTML }));
    } catch (ignored) { /* storage off: the message is lost, as before */ }
  }

  function restoreMessages() {
    var kept;
    try {
      kept = JSON.parse(window.sessionStorage.getItem(KEPT) || "null");
      window.sessionStorage.removeItem(KEPT);
    } catch (ignored) { return; }
    var main = document.querySelector("main");
    if (!kept || kept.path !== window.location.pathname || !main || document.querySelector(".messages")) return;
    main.insertAdjacentHTML("afterbegin", kept.html);
  }

  document.addEventListener("DOMContentLoaded", function () {
    menu();
    latestFirst(document);
    markOverflow(document);
    window.addEventListener("resize", function () { markOverflow(document); });
    restoreMessages();
    document.querySelectorAll("[data-refresh-url]").forEach(schedule);
    document.querySelectorAll("form[data-confirm]").forEach(function (form) {
      form.addEventListener("submit", function (event) {
        if (!window.confirm(form.getAttribute("data-confirm"))) event.preventDefault();
      });
    });
  });
})();
