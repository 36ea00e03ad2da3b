// billing-outbox: the few behaviours the pages need beyond htmx. No inline script anywhere
// (the Content-Security-Policy forbids it); everything hangs off data- attributes.
(function () {
  "use strict";

  // <form data-confirm="Question?">: ask before submitting.
  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (!(form instanceof HTMLFormElement)) return;
    var question = form.getAttribute("data-confirm");
    if (question && !window.confirm(question)) {
      event.preventDefault();
    }
  }, true);

  // <form data-busy="Working…">: once submitted, its button says so and cannot be pressed
  // again (a request that takes seconds, such as preparing a report).
  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (!(form instanceof HTMLFormElement) || event.defaultPrevented) return;
    var busy = form.getAttribute("data-busy");
    var button = form.querySelector('button[type="submit"]');
    if (!busy || !button) return;
    window.setTimeout(function () {   // after the browser has read the form
      button.disabled = true;
      button.textContent = busy;
      button.setAttribute("aria-busy", "true");
    }, 0);
  });

  // <button data-needs-selection>: refuse to submit a bulk action with nothing selected.
  document.addEventListener("click", function (event) {
    var button = event.target.closest ? event.target.closest("[data-needs-selection]") : null;
    if (!button || !button.form) return;
    if (!button.form.querySelector('input[name="ids"]:checked')) {
      event.preventDefault();
      window.alert("Select at least one event first.");
    }
  });

  // <rect data-href="…"> in a chart: a click on a bar opens the events it counts. (The SVG is
  // one image to assistive technology; the same links are in the chart's table view.)
  document.addEventListener("click", function (event) {
    var bar = event.target.closest ? event.target.closest("svg [data-href]") : null;
    if (bar) window.location.assign(bar.getAttribute("data-href"));
  });

  // <input type="checkbox" data-select-all="ids">: (un)check every box of that name in its form.
  document.addEventListener("change", function (event) {
    var box = event.target;
    if (!(box instanceof HTMLInputElement)) return;
    var name = box.getAttribute("data-select-all");
    if (name && box.form) {
      box.form.querySelectorAll('input[type="checkbox"][name="' + name + '"]').forEach(
        function (other) { other.checked = box.checked; });
    }
  });
  // <select data-autosubmit>: submit its form on change.
  document.addEventListener("change", function (event) {
    var select = event.target;
    if (select instanceof HTMLSelectElement && select.hasAttribute("data-autosubmit") &&
        select.form) {
      select.form.requestSubmit ? select.form.requestSubmit() : select.form.submit();
    }
  });

  // A live panel should not be replaced while someone is selecting rows or typing in it.
  document.addEventListener("htmx:beforeRequest", function (event) {
    var elt = event.detail && event.detail.elt;
    if (!elt || !elt.classList || !elt.classList.contains("live")) return;
    var active = document.activeElement;
    if (active && elt.contains(active) && /^(INPUT|SELECT|TEXTAREA)$/.test(active.tagName)) {
      event.preventDefault();
    }
  });

  // <time datetime="…">: the viewer's own local time on hover (the page shows UTC).
  function localTimes(root) {
    root.querySelectorAll("time[datetime]").forEach(function (el) {
      var at = new Date(el.getAttribute("datetime"));
      if (isNaN(at.getTime())) return;
      var local;
      try {
        local = at.toLocaleString(undefined, {year: "numeric", month: "short", day: "numeric",
                                              hour: "2-digit", minute: "2-digit",
                                              second: "2-digit", timeZoneName: "short"});
      } catch (e) {
        local = at.toString();
      }
      el.title = "Your time: " + local;
    });
  }

  // .table-wrap scrolls sideways when its table is wider than the screen: make it a labelled
  // region a keyboard can focus (and so scroll), named after its section's heading.
  function tableRegions(root) {
    root.querySelectorAll(".table-wrap").forEach(function (wrap) {
      if (!wrap.hasAttribute("role")) wrap.setAttribute("role", "region");
      if (!wrap.hasAttribute("aria-label")) {
        var table = wrap.querySelector("table");
        var section = wrap.closest("section, figure, form, main");
        var head = section && section.querySelector("h2, figcaption, h1");
        var name = (table && table.getAttribute("aria-label")) ||
          (head && head.textContent.replace(/\s+/g, " ").trim()) || "Table";
        wrap.setAttribute("aria-label", name);
      }
      if (wrap.scrollWidth > wrap.clientWidth) wrap.setAttribute("tabindex", "0");
      else wrap.removeAttribute("tabindex");
    });
  }

  function enhance(root) {
    localTimes(root);
    tableRegions(root);
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", function () { enhance(document); });
  } else {
    enhance(document);
  }
  // Content swapped in by htmx (polling panels, fragments).
  document.addEventListener("htmx:load", function (event) {
    var elt = event.detail && event.detail.elt;
    enhance(elt && elt.querySelectorAll ? (elt.parentNode || elt) : document);
  });
  window.addEventListener("resize", function () { tableRegions(document); });
})();
