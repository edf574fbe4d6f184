// The Django admin as TMS serves it (tms_project/templates/admin/base_site.html): names and
// keyboard access Django's own pages leave out. No framework, no third-party code.
(function () {
  "use strict";

  function labelOf(select) {
    var label = select.id && document.querySelector('label[for="' + select.id + '"]');
    if (!label) return null;
    if (!label.id) label.id = select.id + "-label";
    return label;
  }

  // Select2 (the autocomplete fields) draws a combobox and its shown value with no name of their
  // own: each is named by the field's label, and the combobox also says what is chosen.
  function nameAutocompletes(root) {
    root.querySelectorAll("select.admin-autocomplete").forEach(function (select) {
      var label = labelOf(select);
      var container = select.nextElementSibling;
      if (!label || !container || !container.classList.contains("select2")) return;
      var combobox = container.querySelector(".select2-selection[role=combobox]");
      var shown = container.querySelector(".select2-selection__rendered");
      if (shown) {
        if (!shown.id) shown.id = select.id + "-shown";
        shown.setAttribute("aria-labelledby", label.id);
      }
      if (combobox) combobox.setAttribute("aria-labelledby", label.id + (shown ? " " + shown.id : ""));
    });
  }

  // A box that scrolls sideways on a narrow screen (an inline's table, a list's results) is
  // reachable by keyboard and named after its heading; where it fits, it is left as it is.
  function scrollBoxes() {
    document.querySelectorAll(".inline-group, #changelist .results").forEach(function (box) {
      var scrolls = box.scrollWidth > box.clientWidth + 1;
      if (scrolls && !box.hasAttribute("data-scrolls")) {
        var heading = box.querySelector("h2");
        box.setAttribute("data-scrolls", "");
        box.setAttribute("tabindex", "0");
        box.setAttribute("role", "region");
        box.setAttribute("aria-label", heading ? heading.textContent.trim() : document.title);
      } else if (!scrolls && box.hasAttribute("data-scrolls")) {
        ["data-scrolls", "tabindex", "role", "aria-label"].forEach(function (name) { box.removeAttribute(name); });
      }
    });
  }

  // Select2 draws its boxes when jQuery finds the document ready, some time after this script
  // ran (and again for a formset's new row): name them as soon as they appear.
  new MutationObserver(function (changes) {
    var drawn = changes.some(function (change) {
      return Array.prototype.some.call(change.addedNodes, function (node) {
        return node.nodeType === 1 && (node.matches(".select2") || node.querySelector(".select2"));
      });
    });
    if (drawn) nameAutocompletes(document);
  }).observe(document.documentElement, { childList: true, subtree: true });
  document.addEventListener("DOMContentLoaded", function () {
    nameAutocompletes(document);
    scrollBoxes();
  });
  window.addEventListener("load", scrollBoxes);
  window.addEventListener("resize", scrollBoxes);
})();
