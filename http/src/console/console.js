// fleetops console: the live tail of a session's log. Lines arrive over the session's
// WebSocket (authenticated by the console's cookie, same origin) and are added to the page
// once per animation frame, so a fast stream costs one layout a frame, not one a line. While
// the reader has scrolled up, new lines wait (nothing is dropped) and a button resumes from
// where the view stood; at most 5,000 lines stay in the page (the oldest leave first).
(function () {
  "use strict";
  var box = document.getElementById("tail");
  if (!box) { return; }
  var list = document.getElementById("tail-lines");
  var status = document.getElementById("tail-status");
  var resume = document.getElementById("tail-resume");
  var KEEP = 5000, HOLD = 100000;
  var pending = [], paused = false, scheduled = false, received = 0, held_dropped = 0;
  function atBottom() { return list.scrollTop + list.clientHeight >= list.scrollHeight - 4; }
  function say(text) { status.textContent = text; }
  function line(f) {
    var li = document.createElement("li");
    li.className = "lvl-" + f.level;
    li.textContent = f.timestamp + " " + f.level.toUpperCase() + " [" + f.module + "] " + f.message;
    return li;
  }
  function flush() {
    scheduled = false;
    if (paused) {
      say("Paused: " + pending.length + " new lines waiting" + (held_dropped ? " (" + held_dropped + " dropped)" : ""));
      return;
    }
    if (pending.length) {
      var frag = document.createDocumentFragment();
      for (var i = 0; i < pending.length; i++) { frag.appendChild(line(pending[i])); }
      pending = [];
      list.appendChild(frag);
      while (list.childElementCount > KEEP) { list.removeChild(list.firstElementChild); }
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
    paused = false; resume.hidden = true; flush(); list.scrollTop = list.scrollHeight;
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
      if (pending.length > HOLD) { held_dropped += pending.length - HOLD; pending.splice(0, pending.length - HOLD); }
      schedule();
    } else if (f.type === "lagged") {
      say("The server skipped " + f.dropped + " lines this page could not take in time");
    } else if (f.type === "session_ended") {
      flush(); say("Session ended (" + f.status + "): " + received + " lines");
    }
  };
  ws.onclose = function () { box.setAttribute("data-open", "0"); if (!paused) { say("Disconnected: " + received + " lines"); } };
}());
