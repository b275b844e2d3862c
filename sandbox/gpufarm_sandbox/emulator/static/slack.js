// The Slack page of the local sandbox: a small Slack client of the sandbox's workspace.
// Everything its user does goes to the sandbox's simulated users, which sign it and send it to the installed
// app as Slack would; what it shows is what the app put into the workspace through the Web API. Text is only
// ever set through textContent, never parsed as HTML: every string from the app or the incidents stays inert.
(function () {
  "use strict";

  var POLL_MS = 1000;
  var OPERATORS_HANDLE = "gpu-operators";
  // Text symbols rather than colour emoji, so a machine without an emoji font (a CI's Chromium) draws them too.
  var EMOJI = {
    white_check_mark: "\u2714", heavy_check_mark: "\u2714", warning: "\u26a0", recycle: "\u267b",
    hourglass: "\u231b", hourglass_flowing_sand: "\u231b", x: "\u2716", no_entry: "\u2298", bell: "\u266a",
    lock: "\u26bf", tada: "\u2605", zzz: "z", bar_chart: "\u2261", gear: "\u2699", information_source: "\u2139",
    hand: "\u270b", clock3: "\u231a", rocket: "\u2197", question: "?", red_circle: "\u25cf",
    large_green_circle: "\u25cf", pushpin: "\u2022", memo: "\u270e", calendar: "\u2637", fire: "\u2668"
  };

  var state = {
    user: null,            // the chosen member's id
    conv: null,            // {kind: "channel" | "app", id, tab: "home" | "messages"}
    data: null,            // the last read of /_sandbox/slack/page
    raw: "",
    modalKey: "",          // id + hash + errors of the modal drawn, so typing survives the polls
    modalDraft: {},
    busy: 0,
    rendered: false
  };

  function $(id) { return document.getElementById(id); }

  function el(tag, cls, text) {
    var node = document.createElement(tag);
    if (cls) { node.className = cls; }
    if (text !== undefined && text !== null) { node.textContent = String(text); }
    return node;
  }

  function clear(node) { while (node.firstChild) { node.removeChild(node.firstChild); } }

  // -- talking to the sandbox ---------------------------------------------------------------------------------

  function request(method, path, body) {
    var init = { method: method, headers: { "Accept": "application/json" }, cache: "no-store" };
    if (body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    return fetch(path, init).then(function (response) {
      return response.text().then(function (text) {
        var parsed = null;
        try { parsed = text ? JSON.parse(text) : null; } catch (e) { parsed = { raw: text }; }
        return { status: response.status, body: parsed };
      });
    });
  }

  function appUrl() {
    return state.data && state.data.app ? state.data.app.request_url : null;
  }

  function say(text, error) {
    var status = $("status");
    status.textContent = text || "";
    status.className = error ? "error" : "";
  }

  // What Slack shows when the app did not answer as it should.
  function delivered(answer, what) {
    var body = answer.body || {};
    if (answer.status !== 200) {
      say(what + " was refused by the sandbox: " + (body.error || body.errors || answer.status), true);
      return false;
    }
    if (body.error) {
      say(what + " failed with the error \u201c" + body.error + "\u201d", true);
      return false;
    }
    if (body.status !== 200 && body.status !== undefined && body.status !== null) {
      say(what + " failed: the app answered " + body.status + " " + String(body.body || "").slice(0, 200), true);
      return false;
    }
    say("");
    return true;
  }

  function act(promise) {
    state.busy += 1;
    document.body.dataset.busy = "true";
    return promise.then(function (result) {
      state.busy -= 1;
      if (!state.busy) { document.body.dataset.busy = "false"; }
      poll();
      setTimeout(poll, 300);
      return result;
    }, function (err) {
      state.busy -= 1;
      if (!state.busy) { document.body.dataset.busy = "false"; }
      say("The sandbox could not be reached: " + err, true);
    });
  }

  function poll() {
    var path = "/_sandbox/slack/page" + (state.user ? "?user=" + encodeURIComponent(state.user) : "");
    return request("GET", path).then(function (answer) {
      if (answer.status !== 200 || !answer.body) {
        say("The sandbox answered " + answer.status, true);
        return;
      }
      var raw = JSON.stringify(answer.body);
      if (raw === state.raw) { return; }
      state.raw = raw;
      state.data = answer.body;
      render();
    }, function () { say("The sandbox is not answering; is `gpufarm local` running?", true); });
  }

  // -- the chosen user and conversation ------------------------------------------------------------------------

  function operators() {
    var groups = (state.data && state.data.usergroups) || {};
    return groups[OPERATORS_HANDLE] || [];
  }

  function userName(id) {
    var users = (state.data && state.data.users) || [];
    for (var i = 0; i < users.length; i++) { if (users[i].id === id) { return users[i].name; } }
    if (state.data && state.data.bot && state.data.bot.id === id) { return state.data.bot.name; }
    return id;
  }

  function chooseUser(id) {
    if (state.user === id) { return; }
    state.user = id;
    state.raw = "";
    state.modalKey = "";
    var params = new URLSearchParams(location.search);
    params.set("user", id);
    history.replaceState(null, "", location.pathname + "?" + params.toString());
    if (state.conv && state.conv.kind === "app" && state.conv.tab === "home") { openHome(); }
    poll();
  }

  function chooseChannel(id) {
    state.conv = { kind: "channel", id: id };
    renderConversation();
  }

  function openApp(tab) {
    state.conv = { kind: "app", id: state.data ? state.data.dm : null, tab: tab };
    if (tab === "home") { openHome(); }
    renderConversation();
  }

  // Opening the Home tab is what makes Slack send `app_home_opened` to the app.
  function openHome() {
    if (!state.user) { return; }
    act(request("POST", "/_sandbox/slack/events", { user: state.user, type: "app_home_opened", tab: "home" })
      .then(function (answer) { delivered(answer, "Opening the Home tab"); }));
  }

  // -- rendering -----------------------------------------------------------------------------------------------

  function render() {
    var data = state.data;
    renderSidebar(data);
    if (!state.user && data.users.length) {
      var wanted = new URLSearchParams(location.search).get("user");
      var found = data.users.filter(function (u) { return u.id === wanted || u.name === wanted; })[0];
      chooseUser((found || data.users[0]).id);
      return;
    }
    if (!state.conv) {
      var research = data.channels.filter(function (c) { return c.name !== "gpu-ops"; })[0] || data.channels[0];
      state.conv = research ? { kind: "channel", id: research.id } : { kind: "app", tab: "messages" };
    }
    renderConversation();
    renderModal();
    if (!state.rendered) {
      state.rendered = true;
      document.body.dataset.rendered = "true";
    }
  }

  function renderSidebar(data) {
    var who = $("who");
    var ops = operators();
    if (who.options.length !== data.users.length) {
      clear(who);
      data.users.forEach(function (u) {
        var label = u.real_name + " (@" + u.name + ")" + (ops.indexOf(u.id) >= 0 ? " \u00b7 operator" : "");
        var option = el("option", null, label);
        option.value = u.id;
        who.appendChild(option);
      });
    }
    if (state.user) { who.value = state.user; }
    var channels = $("channels");
    clear(channels);
    data.channels.forEach(function (c) {
      var li = el("li");
      var button = el("button", "nav" + (state.conv && state.conv.kind === "channel" && state.conv.id === c.id ? " active" : ""), "# " + c.name);
      button.type = "button";
      button.dataset.channel = c.name;
      button.addEventListener("click", function () { chooseChannel(c.id); });
      li.appendChild(button);
      channels.appendChild(li);
    });
    var apps = $("apps");
    clear(apps);
    var li = el("li");
    var app = el("button", "nav" + (state.conv && state.conv.kind === "app" ? " active" : ""), data.bot.name);
    app.type = "button";
    app.id = "open-app";
    app.addEventListener("click", function () { openApp("home"); });
    li.appendChild(app);
    apps.appendChild(li);
    $("app-url").textContent = data.app.request_url ? "App: " + data.app.request_url : "No app installed (POST /_sandbox/slack/app).";
  }

  function renderConversation() {
    var data = state.data;
    if (!data || !state.conv) { return; }
    var conv = state.conv;
    var title = $("conv-title");
    var messages = $("messages");
    var home = $("home");
    var tabs = $("tabs");
    var composer = $("composer");
    if (conv.kind === "channel") {
      var channel = data.channels.filter(function (c) { return c.id === conv.id; })[0];
      title.textContent = "# " + (channel ? channel.name : conv.id);
      tabs.hidden = true;
      home.hidden = true;
      messages.hidden = false;
      composer.hidden = false;
      $("box").placeholder = "Message #" + (channel ? channel.name : "") + " \u2014 type /gpu help";
      renderMessages(messages, (data.messages || {})[conv.id] || [], conv.id);
    } else {
      title.textContent = data.bot.name;
      tabs.hidden = false;
      $("tab-home").className = "tab" + (conv.tab === "home" ? " active" : "");
      $("tab-messages").className = "tab" + (conv.tab === "messages" ? " active" : "");
      if (conv.tab === "home") {
        messages.hidden = true;
        composer.hidden = true;
        home.hidden = false;
        renderHome(home, data.home);
      } else {
        home.hidden = true;
        messages.hidden = false;
        composer.hidden = false;
        $("box").placeholder = "Message " + data.bot.name + " \u2014 type /gpu help";
        renderMessages(messages, (data.messages || {})[data.dm] || [], data.dm);
      }
    }
    renderSidebar(data);
  }

  function renderMessages(root, rows, channel) {
    var atBottom = root.scrollHeight - root.scrollTop - root.clientHeight < 40;
    clear(root);
    if (!rows.length) {
      root.appendChild(el("p", "empty", "No messages yet. Type /gpu help below."));
    }
    rows.forEach(function (m) {
      var item = el("article", "message" + (m.only_you ? " ephemeral" : ""));
      item.dataset.ts = m.ts;
      var head = el("div", "message-head");
      head.appendChild(el("span", "author", userName(m.user)));
      if (m.user === (state.data.bot && state.data.bot.id)) { head.appendChild(el("span", "app-badge", "APP")); }
      head.appendChild(el("span", "time", timeOf(m.ts)));
      if (m.edited) { head.appendChild(el("span", "edited", "(edited)")); }
      item.appendChild(head);
      if (m.only_you) { item.appendChild(el("div", "only-you", "Only visible to you")); }
      var body = el("div", "message-body");
      renderBlocks(body, m.blocks || [], { surface: "message", channel: channel, ts: m.ts });
      item.appendChild(body);
      root.appendChild(item);
    });
    if (atBottom || !root.dataset.seen) {
      root.scrollTop = root.scrollHeight;
      root.dataset.seen = "true";
    }
  }

  function renderHome(root, view) {
    clear(root);
    if (!view) {
      root.appendChild(el("p", "empty", "Opening your Home\u2026 (the app publishes it when the tab opens)"));
      return;
    }
    var surface = el("div", "home-surface");
    surface.dataset.viewId = view.id;
    renderBlocks(surface, view.blocks || [], { surface: "home", viewId: view.id });
    root.appendChild(surface);
  }

  function timeOf(ts) {
    var seconds = parseFloat(ts);
    if (!isFinite(seconds)) { return ""; }
    var d = new Date(seconds * 1000);
    return d.toISOString().slice(11, 16) + " UTC";
  }

  // -- Block Kit -----------------------------------------------------------------------------------------------

  function renderBlocks(root, blocks, where) {
    blocks.forEach(function (block) {
      var node = renderBlock(block, where);
      if (node) { root.appendChild(node); }
    });
  }

  function renderBlock(block, where) {
    var type = block.type;
    var node;
    if (type === "section") {
      node = el("div", "bk-section");
      var main = el("div", "bk-section-main");
      if (block.text) { main.appendChild(textObject(block.text)); }
      if (block.fields) {
        var fields = el("div", "bk-fields");
        block.fields.forEach(function (f) { var cell = el("div", "bk-field"); cell.appendChild(textObject(f)); fields.appendChild(cell); });
        main.appendChild(fields);
      }
      node.appendChild(main);
      if (block.accessory) {
        var accessory = element(block.accessory, block.block_id, where);
        if (accessory) { node.appendChild(accessory); }
      }
    } else if (type === "header") {
      node = el("h3", "bk-header", block.text ? block.text.text : "");
    } else if (type === "divider") {
      node = el("hr", "bk-divider");
    } else if (type === "context") {
      node = el("div", "bk-context");
      (block.elements || []).forEach(function (e) {
        if (e.type === "image") { node.appendChild(el("span", "bk-image-alt", e.alt_text || "")); }
        else { node.appendChild(textObject(e)); }
      });
    } else if (type === "actions") {
      node = el("div", "bk-actions");
      (block.elements || []).forEach(function (e) {
        var made = element(e, block.block_id, where);
        if (made) { node.appendChild(made); }
      });
    } else if (type === "input") {
      node = inputBlock(block, where);
    } else if (type === "rich_text") {
      node = el("div", "bk-rich");
      (block.elements || []).forEach(function (section) {
        (section.elements || []).forEach(function (e) {
          if (e.type === "text") { node.appendChild(mrkdwn(e.text || "")); }
          else if (e.type === "link") { node.appendChild(link(e.url, e.text || e.url)); }
          else if (e.type === "user") { node.appendChild(el("span", "mention", "@" + userName(e.user_id))); }
        });
      });
    } else if (type === "image") {
      node = el("div", "bk-image-alt", block.alt_text || "(image)");
    } else if (type === "markdown") {
      node = el("div", "bk-markdown");
      node.appendChild(mrkdwn(block.text || ""));
    } else {
      node = el("div", "bk-unknown", "(" + type + " block)");
    }
    if (block.block_id) { node.dataset.blockId = block.block_id; }
    return node;
  }

  function textObject(obj) {
    if (!obj) { return el("span"); }
    if (obj.type === "plain_text") { return el("span", "plain", obj.text); }
    return mrkdwn(obj.text || "");
  }

  function element(e, blockId, where) {
    if (e.type === "button") {
      var button = el("button", "btn" + (e.style ? " " + e.style : ""), e.text ? e.text.text : "");
      button.type = "button";
      button.dataset.actionId = e.action_id || "";
      if (e.value !== undefined) { button.dataset.value = e.value; }
      button.addEventListener("click", function () {
        var go = function () { click(e, blockId, where, e.value); };
        if (e.confirm) { confirmThen(e.confirm, go); } else { go(); }
      });
      return button;
    }
    if (e.type === "static_select" && where.surface !== "modal") {
      var select = el("select", "bk-select");
      select.appendChild(el("option", null, e.placeholder ? e.placeholder.text : "Choose\u2026"));
      (e.options || []).forEach(function (o) { var opt = el("option", null, o.text.text); opt.value = o.value; select.appendChild(opt); });
      select.addEventListener("change", function () { click(e, blockId, where, select.value); });
      return select;
    }
    return el("span", "bk-unknown", "(" + e.type + ")");
  }

  function click(e, blockId, where, value) {
    var body = { type: "block_actions", user: state.user, url: appUrl(), action_id: e.action_id, block_id: blockId };
    if (value !== undefined && value !== null) { body.value = String(value); }
    if (where.surface === "message") {
      body.channel = where.channel;
      body.message_ts = where.ts;
    } else {
      body.view_id = where.viewId;
    }
    act(request("POST", "/_sandbox/slack/interactions", body).then(function (answer) {
      delivered(answer, "The click");
    }));
  }

  function confirmThen(confirm, go) {
    var overlay = $("confirm-overlay");
    $("confirm-title").textContent = confirm.title ? confirm.title.text : "Are you sure?";
    var text = $("confirm-text");
    clear(text);
    text.appendChild(textObject(confirm.text));
    var ok = $("confirm-ok");
    var deny = $("confirm-deny");
    ok.textContent = confirm.confirm ? confirm.confirm.text : "Yes";
    ok.className = "btn " + (confirm.style === "danger" ? "danger" : "primary");
    deny.textContent = confirm.deny ? confirm.deny.text : "Cancel";
    overlay.hidden = false;
    ok.onclick = function () { overlay.hidden = true; go(); };
    deny.onclick = function () { overlay.hidden = true; };
  }

  // -- modals --------------------------------------------------------------------------------------------------

  function renderModal() {
    var view = state.data && state.data.modal;
    var overlay = $("overlay");
    if (!view) {
      overlay.hidden = true;
      state.modalKey = "";
      state.modalDraft = {};
      return;
    }
    var key = view.id + "|" + view.hash + "|" + JSON.stringify(view.errors || {});
    if (key === state.modalKey) { return; }
    if (state.modalKey.split("|")[0] !== view.id) { state.modalDraft = {}; }
    state.modalKey = key;
    overlay.hidden = false;
    $("modal").dataset.viewId = view.id;
    $("modal-title").textContent = view.title ? view.title.text : "";
    var body = $("modal-body");
    clear(body);
    renderBlocks(body, view.blocks || [], { surface: "modal", viewId: view.id, errors: view.errors || {} });
    $("modal-error").textContent = "";
    var close = $("modal-close");
    close.textContent = view.close ? view.close.text : "Cancel";
    close.onclick = function () { closeModal(view); };
    var submit = $("modal-submit");
    submit.hidden = !view.submit;
    submit.textContent = view.submit ? view.submit.text : "Submit";
    submit.onclick = function () { submitModal(view); };
  }

  function inputBlock(block, where) {
    var node = el("div", "bk-input");
    var id = "in-" + block.block_id;
    var label = el("label", "bk-label", block.label ? block.label.text : "");
    label.htmlFor = id;
    if (block.optional) { label.appendChild(el("span", "optional", " (optional)")); }
    node.appendChild(label);
    var e = block.element || {};
    var draftKey = block.block_id + "/" + e.action_id;
    var control;
    if (e.type === "static_select") {
      control = el("select", "bk-control");
      control.appendChild(el("option", null, e.placeholder ? e.placeholder.text : "Choose\u2026")).value = "";
      (e.options || []).forEach(function (o) { var opt = el("option", null, o.text.text); opt.value = o.value; control.appendChild(opt); });
      if (e.initial_option) { control.value = e.initial_option.value; }
    } else if (e.type === "plain_text_input" && e.multiline) {
      control = el("textarea", "bk-control");
      if (e.initial_value) { control.value = e.initial_value; }
    } else {
      control = el("input", "bk-control");
      control.type = e.type === "number_input" ? "number" : "text";
      if (e.type === "number_input" && e.min_value) { control.min = e.min_value; }
      if (e.type === "number_input" && e.max_value) { control.max = e.max_value; }
      if (e.initial_value) { control.value = e.initial_value; }
      if (e.placeholder) { control.placeholder = e.placeholder.text; }
    }
    control.id = id;
    control.name = block.block_id;
    control.dataset.blockId = block.block_id;
    control.dataset.actionId = e.action_id || "";
    control.dataset.optional = block.optional ? "true" : "false";
    if (Object.prototype.hasOwnProperty.call(state.modalDraft, draftKey)) { control.value = state.modalDraft[draftKey]; }
    control.addEventListener("input", function () { state.modalDraft[draftKey] = control.value; });
    control.addEventListener("change", function () { state.modalDraft[draftKey] = control.value; });
    node.appendChild(control);
    if (block.hint) { node.appendChild(el("div", "bk-hint", block.hint.text)); }
    var error = (where.errors || {})[block.block_id];
    if (error) { node.appendChild(el("div", "bk-error", error)); }
    return node;
  }

  function submitModal(view) {
    var values = {};
    var missing = false;
    Array.prototype.forEach.call($("modal-body").querySelectorAll(".bk-control"), function (control) {
      var value = control.value;
      var holder = control.parentNode;
      var old = holder.querySelector(".bk-required");
      if (old) { holder.removeChild(old); }
      if (!value && control.dataset.optional !== "true") {
        holder.appendChild(el("div", "bk-error bk-required", "Please complete this required field."));
        missing = true;
      }
      if (value) {
        values[control.dataset.blockId] = values[control.dataset.blockId] || {};
        values[control.dataset.blockId][control.dataset.actionId] = value;
      }
    });
    if (missing) { return; }
    act(request("POST", "/_sandbox/slack/interactions", {
      type: "view_submission", user: state.user, url: appUrl(), view_id: view.id, values: values
    }).then(function (answer) {
      if (delivered(answer, "Submitting the form")) {
        var outcome = answer.body.outcome;
        if (outcome === "failed") { $("modal-error").textContent = "We had some trouble connecting. Try again?"; }
      }
    }));
  }

  function closeModal(view) {
    $("overlay").hidden = true;
    act(request("POST", "/_sandbox/slack/interactions", {
      type: "view_closed", user: state.user, url: appUrl(), view_id: view.id
    }).then(function (answer) { delivered(answer, "Closing the form"); }));
  }

  // -- mrkdwn --------------------------------------------------------------------------------------------------

  var ESCAPED = { "&amp;": "&", "&lt;": "<", "&gt;": ">" };

  function unescape(text) {
    return text.replace(/&(amp|lt|gt);/g, function (m) { return ESCAPED[m]; });
  }

  function link(url, label) {
    if (!/^https?:\/\//i.test(url)) { return el("span", null, label); }
    var a = el("a", "link", label);
    a.href = url;
    a.target = "_blank";
    a.rel = "noopener noreferrer";
    return a;
  }

  // Slack's mrkdwn: <links|words>, <@mentions>, *bold*, _italic_, ~strike~, `code`, ```blocks```, > quotes, :emoji:.
  function mrkdwn(text) {
    var root = el("span", "mrkdwn");
    var parts = text.split("```");
    parts.forEach(function (part, i) {
      if (i % 2 === 1) { root.appendChild(el("pre", "code-block", unescape(part))); return; }
      var lines = part.split("\n");
      lines.forEach(function (line, j) {
        var holder = root;
        if (/^(&gt;|>)/.test(line)) {
          holder = el("span", "quote");
          root.appendChild(holder);
          line = line.replace(/^(&gt;|>)\s?/, "");
        }
        inline(holder, line);
        if (j < lines.length - 1) { root.appendChild(el("br")); }
      });
    });
    return root;
  }

  var TOKEN = "(<[^<>\\n]+>)|(`[^`\\n]+`)|(\\*[^*\\n]+\\*)|(_[^_\\n]+_)|(~[^~\\n]+~)|(:[a-z0-9_+\\-]+:)";

  function inline(root, text) {
    var last = 0;
    var match;
    var tokens = new RegExp(TOKEN, "g");  // one per call: bold and italic recurse
    while ((match = tokens.exec(text)) !== null) {
      if (match.index > last) { root.appendChild(document.createTextNode(unescape(text.slice(last, match.index)))); }
      var token = match[0];
      if (match[1]) { root.appendChild(angle(token.slice(1, -1))); }
      else if (match[2]) { root.appendChild(el("code", null, unescape(token.slice(1, -1)))); }
      else if (match[6]) {
        var name = token.slice(1, -1);
        root.appendChild(document.createTextNode(EMOJI[name] || token));
      } else {
        var tag = match[3] ? "strong" : (match[4] ? "em" : "s");
        var inner = el(tag);
        inline(inner, token.slice(1, -1));
        root.appendChild(inner);
      }
      last = match.index + token.length;
    }
    if (last < text.length) { root.appendChild(document.createTextNode(unescape(text.slice(last)))); }
  }

  function angle(inside) {
    var bar = inside.indexOf("|");
    var target = bar >= 0 ? inside.slice(0, bar) : inside;
    var label = bar >= 0 ? inside.slice(bar + 1) : "";
    if (target.charAt(0) === "@") { return el("span", "mention", "@" + userName(target.slice(1))); }
    if (target.charAt(0) === "#") {
      var channel = (state.data.channels || []).filter(function (c) { return c.id === target.slice(1); })[0];
      return el("span", "mention", "#" + (label || (channel ? channel.name : target.slice(1))));
    }
    if (target.charAt(0) === "!") {
      var special = target.slice(1).split("^")[0];
      return el("span", "mention", "@" + (label || special));
    }
    return link(unescape(target), unescape(label || target));
  }

  // -- wiring --------------------------------------------------------------------------------------------------

  function send(event) {
    event.preventDefault();
    var box = $("box");
    var text = box.value.trim();
    if (!text) { return; }
    if (!appUrl()) { say("No app is installed in the sandbox's workspace.", true); return; }
    var match = /^(\/[a-z0-9_\-]+)(?:\s+([\s\S]*))?$/.exec(text);
    if (!match) {
      say("Only slash commands reach the app here: try /gpu help");
      return;
    }
    var channel = state.conv.kind === "channel" ? state.conv.id : state.data.dm;
    box.value = "";
    act(request("POST", "/_sandbox/slack/commands", {
      user: state.user, channel: channel, command: match[1], text: match[2] || "", url: appUrl()
    }).then(function (answer) { delivered(answer, match[1]); }));
  }

  document.addEventListener("DOMContentLoaded", function () {
    $("who").addEventListener("change", function () { chooseUser($("who").value); });
    $("composer").addEventListener("submit", send);
    $("tab-home").addEventListener("click", function () { openApp("home"); });
    $("tab-messages").addEventListener("click", function () { openApp("messages"); });
    poll();
    setInterval(poll, POLL_MS);
  });
})();
