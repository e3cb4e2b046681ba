// tickler dashboard: the little script it needs. Everything works without it, except
// the confirmation of bulk and destructive actions.
"use strict";

// Forms with data-confirm ask first.
document.addEventListener("submit", (event) => {
  const form = event.target;
  const question = form.getAttribute && form.getAttribute("data-confirm");
  if (question && !window.confirm(question)) {
    event.preventDefault();
  }
});

// An element with data-refresh="N" reloads its own content every N seconds while the tab is
// visible (the overview, a queue's figures), without reloading the page or losing the scroll position.
document.addEventListener("DOMContentLoaded", () => {
  const live = document.querySelector("[data-refresh]");
  if (!live) return;
  const seconds = Math.max(2, parseInt(live.getAttribute("data-refresh"), 10) || 10);
  const refresh = async () => {
    if (document.hidden) return;
    try {
      const response = await fetch(window.location.href, { credentials: "same-origin", headers: { "Accept": "text/html" } });
      if (response.redirected || !response.ok) { window.location.reload(); return; }
      const page = new DOMParser().parseFromString(await response.text(), "text/html");
      const fresh = page.getElementById(live.id);
      if (fresh) { live.replaceChildren(...fresh.childNodes); live.dataset.refreshedAt = String(Date.now()); }
    } catch (error) {
      // offline or restarting: try again at the next tick
    }
  };
  window.setInterval(refresh, seconds * 1000);
});
