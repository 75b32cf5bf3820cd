// fleetops console: the live tail of a session's log. Lines arrive over the session's
// WebSocket (authenticated by the console's cookie, same origin) and are added to the page
// once per animation frame, so a fast stream costs one layout a frame, not one a line. The
// page keeps the newest 5,000 lines. While the reader has scrolled up, new lines wait (the
// newest 20,000, the count of any older ones shown) and Resume appends them after the last
// line shown, then follows the live end again. Messages are clipped to 2,000 characters.
(function () {
  "use strict";
  var box = document.getElementById("tail");
  if (!box) { return; }
  var list = document.getElementById("tail-lines");
  var status = document.getElementById("tail-status");
  var resume = document.getElementById("tail-resume");
  var KEEP = 5000, HOLD = 20000, CLIP = 2000;
  var pending = [], start = 0, paused = false, scheduled = false, ended = false;
  var received = 0, skipped = 0;
  function atBottom() { return list.scrollTop + list.clientHeight >= list.scrollHeight - 4; }
  function say(text) { if (!ended) { status.textContent = text; } }
  function waiting() { return pending.length - start; }
  function line(f) {
    var li = document.createElement("li");
    var m = String(f.message);
    if (m.length > CLIP) { m = m.slice(0, CLIP) + "\u2026"; }
    li.className = "lvl-" + f.level;
    li.textContent = f.timestamp + " " + String(f.level).toUpperCase() + " [" + f.module + "] " + m;
    return li;
  }
  // Drops waiting lines past `limit` (the oldest) in one step, counting them.
  function trim(limit) {
    if (waiting() > limit) {
      var drop = waiting() - limit;
      skipped += drop;
      start += drop;
    }
    if (start > 4096) { pending = pending.slice(start); start = 0; }
  }
  function flush() {
    scheduled = false;
    if (paused) {
      say("Paused: " + waiting() + " new lines waiting" + (skipped ? " (" + skipped + " older not kept)" : ""));
      return;
    }
    // Only the newest KEEP can stay in the page: older waiting lines are never built.
    trim(KEEP);
    if (waiting()) {
      var frag = document.createDocumentFragment();
      for (var i = start; i < pending.length; i++) { frag.appendChild(line(pending[i])); }
      pending = []; start = 0;
      list.appendChild(frag);
      var extra = list.childElementCount - KEEP;
      if (extra > 0) {
        var range = document.createRange();
        range.setStartBefore(list.firstElementChild);
        range.setEndAfter(list.children[extra - 1]);
        range.deleteContents();
      }
      list.scrollTop = list.scrollHeight;
    }
    list.setAttribute("data-received", String(received));
    say("Live: " + received + " lines");
  }
  function schedule() { if (!scheduled) { scheduled = true; window.requestAnimationFrame(flush); } }
  list.addEventListener("scroll", function () {
    var up = !atBottom();
    if (up !== paused) { paused = up; resume.hidden = !paused; schedule(); }
  });
  resume.addEventListener("click", function () {
    paused = false; resume.hidden = true; flush();
  });
  var proto = window.location.protocol === "https:" ? "wss://" : "ws://";
  var ws = new WebSocket(proto + window.location.host + box.getAttribute("data-ws"));
  ws.onopen = function () { say("Live"); box.setAttribute("data-open", "1"); };
  ws.onmessage = function (e) {
    var f;
    try { f = JSON.parse(e.data); } catch (err) { return; }
    if (f.type === "log") {
      received += 1;
      pending.push(f);
      // A paused view holds more; a hidden tab (no animation frames) keeps what it can show.
      trim(paused ? HOLD : KEEP);
      list.setAttribute("data-received", String(received));
      schedule();
    } else if (f.type === "lagged") {
      say("The server skipped " + f.dropped + " lines this page could not take in time");
    } else if (f.type === "session_ended") {
      flush(); say("Session ended (" + f.status + "): " + received + " lines"); ended = true;
    }
  };
  ws.onclose = function () { box.setAttribute("data-open", "0"); say("Disconnected: " + received + " lines"); };
}());
