// turnfsm's session view: one file, inlined in the page (no network but the
// page's own server, when it has one). A turn's details load when it is
// opened; "more turns" loads the next page of them. The server escapes
// every text; the fragments it sends are its own markup.
(function () {
  "use strict";
  function load(url, done) {
    fetch(url, { credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.text() : Promise.reject(r.status); })
      .then(done)
      .catch(function (why) { done("<p class=\"warn\">could not load: " + String(why).replace(/[<&]/g, "") + "</p>"); });
  }
  document.addEventListener("toggle", function (event) {
    var details = event.target;
    if (!details.open || !details.dataset || !details.dataset.src || details.dataset.loaded) return;
    details.dataset.loaded = "1";
    load(details.dataset.src, function (markup) {
      var slot = details.querySelector(".detail");
      slot.outerHTML = markup;
    });
  }, true);
  document.addEventListener("click", function (event) {
    var button = event.target;
    if (!button.classList || !button.classList.contains("more")) return;
    button.disabled = true;
    load(button.dataset.src, function (markup) {
      document.getElementById(button.dataset.into).insertAdjacentHTML("beforeend", markup);
      button.remove();
    });
  });
  // What the server works out after the page (a run's path) loads at once.
  Array.prototype.forEach.call(document.querySelectorAll("[data-load]"), function (slot) {
    load(slot.dataset.load, function (markup) { slot.outerHTML = markup; });
  });
  // Open what the address names: #ID (the browser scrolls to it), or
  // ?open=ID,ID (opened where they are: the page stays at its top).
  function reveal(id) {
    var target = document.getElementById(id);
    for (var node = target; node; node = node.parentElement) {
      if (node.tagName === "DETAILS") node.open = true;
    }
    // A path step (a diagram edge links to its first one): mark every step
    // that went along the same edge.
    if (target && target.dataset && target.dataset.edge !== undefined) {
      Array.prototype.forEach.call(target.parentElement.children, function (step) {
        step.classList.toggle("along", step.dataset.edge === target.dataset.edge);
      });
    }
  }
  // The address's anchor, decoded (one that is no percent-encoding: as it is).
  function anchor() {
    var raw = location.hash.slice(1);
    try { return decodeURIComponent(raw); } catch (e) { return raw; }
  }
  if (location.hash) reveal(anchor());
  window.addEventListener("hashchange", function () {
    var id = anchor();
    reveal(id);
    var target = document.getElementById(id);
    if (target) target.scrollIntoView();
  });
  var asked = new URLSearchParams(location.search).get("open");
  if (asked) asked.split(",").forEach(reveal);
})();
