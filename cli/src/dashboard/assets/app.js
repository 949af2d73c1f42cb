// The dashboard's only script: applies the server's live stream to the page, filters the
// overview, draws ages from the local clock, and sends actions after a confirmation.
(function () {
  "use strict";
  var connection = document.getElementById("connection");
  var rows = document.getElementById("rows");
  var filter = document.getElementById("namespace-filter");
  var search = document.getElementById("search");
  var count = document.getElementById("count");
  var toast = document.getElementById("toast");

  function age(created) {
    var then = Date.parse(created);
    if (isNaN(then)) { return ""; }
    var s = Math.max(0, Math.floor((Date.now() - then) / 1000));
    if (s < 120) { return s + "s"; }
    var m = Math.floor(s / 60);
    if (m < 180) { return m + "m"; }
    var h = Math.floor(m / 60);
    if (h < 48) { return h + "h"; }
    return Math.floor(h / 24) + "d";
  }

  function drawAges() {
    var cells = document.querySelectorAll("[data-created]");
    for (var i = 0; i < cells.length; i++) {
      cells[i].textContent = age(cells[i].getAttribute("data-created"));
    }
  }

  function applyFilter() {
    if (!rows) { return; }
    var ns = filter ? filter.value : "";
    var words = search ? search.value.trim().toLowerCase() : "";
    var shown = 0;
    for (var i = 0; i < rows.children.length; i++) {
      var row = rows.children[i];
      var visible = (ns === "" || row.getAttribute("data-namespace") === ns) &&
        (words === "" || (row.getAttribute("data-search") || "").indexOf(words) >= 0);
      row.hidden = !visible;
      if (visible) { shown++; }
    }
    if (count) { count.textContent = shown + " of " + rows.children.length + " rollouts"; }
  }

  function addNamespace(ns) {
    if (!filter || !ns) { return; }
    for (var i = 0; i < filter.options.length; i++) {
      if (filter.options[i].value === ns) { return; }
    }
    var option = document.createElement("option");
    option.value = ns;
    option.textContent = ns;
    filter.appendChild(option);
  }

  function show(message, ok) {
    toast.textContent = message;
    toast.className = ok ? "toast ok" : "toast failed";
    toast.hidden = false;
  }

  var stream = document.body.getAttribute("data-stream");
  if (stream && window.EventSource) {
    var source = new EventSource(stream);
    source.onopen = function () { connection.textContent = "live"; connection.className = "connection live"; };
    source.onerror = function () { connection.textContent = "reconnecting"; connection.className = "connection lost"; };
    source.addEventListener("row", function (event) {
      var holder = document.createElement("tbody");
      holder.innerHTML = event.data;
      var row = holder.firstElementChild;
      if (!row || !rows) { return; }
      var old = document.getElementById(row.id);
      if (old) { old.replaceWith(row); } else { rows.appendChild(row); }
      addNamespace(row.getAttribute("data-namespace"));
      drawAges();
      applyFilter();
    });
    source.addEventListener("remove", function (event) {
      var old = document.getElementById(event.data);
      if (old) { old.remove(); }
      applyFilter();
    });
    source.addEventListener("live", function (event) {
      var live = document.getElementById("live");
      if (live) { live.innerHTML = event.data; }
      drawAges();
    });
  }

  document.addEventListener("click", function (event) {
    var button = event.target.closest("button[data-action]");
    if (!button) { return; }
    var argument = "";
    var prompt = button.getAttribute("data-prompt");
    if (prompt) {
      argument = window.prompt(prompt, button.getAttribute("data-value") || "");
      if (argument === null) { return; }
    }
    if (!window.confirm(button.getAttribute("data-confirm") + (argument ? "\n" + argument : ""))) { return; }
    button.disabled = true;
    fetch(button.getAttribute("data-url"), {
      method: "POST",
      headers: { "X-Rollouts-Dashboard": "action", "Content-Type": "text/plain" },
      body: argument
    }).then(function (response) {
      return response.text().then(function (text) { show(text, response.ok); });
    }).catch(function (error) {
      show("the dashboard did not answer: " + error, false);
    }).then(function () { button.disabled = false; });
  });

  if (filter) { filter.addEventListener("change", applyFilter); }
  if (search) { search.addEventListener("input", applyFilter); }
  drawAges();
  applyFilter();
  // Ages move with the local clock; nothing is fetched.
  window.setInterval(drawAges, 1000);
})();
