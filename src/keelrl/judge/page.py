"""The judge page: one self-contained HTML document (inline CSS and JS, nothing fetched but the session's
own JSON API), served by judge_server.py.

Model text is only ever put in the page as text nodes (`textContent`), never as HTML, so a completion that
contains markup shows as markup. `<think>` and `<answer>` blocks are drawn as distinct boxes, and role-tagged
turns (`<|im_start|>role ... <|im_end|>`, as judge.py writes a multi-turn episode) as a transcript. Keyboard
first: ArrowLeft / ArrowRight (that side is better), ArrowDown or t (tie), s (skip), u or Backspace (undo),
v (show the verifier's verdict). Keys pressed while a request is in flight are ignored, so one press is at
most one vote. Pairs with identical texts never reach the page (each is a tie without asking, counted at the
end). The model names and results appear only once the session is finished (every judge done); until then
the page says whom it waits for and asks again every few seconds. `document.body.dataset` exposes the page's
state (pair, done, busy, results: waiting or shown) for tests.
"""

from __future__ import annotations

PAGE = r"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>keelrl judge</title><link rel="icon" href="data:,">
<style>
:root { --bg: #f6f7f9; --card: #fff; --ink: #1d2330; --muted: #667085; --line: #d9dde5; --accent: #2f6fed; }
* { box-sizing: border-box; }
body { margin: 0; font: 15px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; background: var(--bg); color: var(--ink); }
header { display: flex; align-items: center; gap: 16px; padding: 10px 20px; background: var(--card); border-bottom: 1px solid var(--line); }
header h1 { font-size: 17px; margin: 0; }
#who { color: var(--muted); margin-left: auto; }
#who button { margin-left: 8px; }
#bar { flex: 1; max-width: 420px; height: 10px; background: #e6e9ef; border-radius: 5px; overflow: hidden; }
#fill { height: 100%; width: 0; background: var(--accent); transition: width .2s; }
#count { color: var(--muted); min-width: 90px; }
main { padding: 16px 20px; }
.prompt { background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: 10px 14px; margin-bottom: 14px; white-space: pre-wrap; }
.label { font-size: 12px; text-transform: uppercase; letter-spacing: .05em; color: var(--muted); margin-bottom: 4px; }
.sides { display: grid; grid-template-columns: 1fr 1fr; gap: 14px; }
.side { background: var(--card); border: 2px solid var(--line); border-radius: 8px; padding: 10px 14px; min-height: 160px; }
.side.picked { border-color: var(--accent); }
.text { white-space: pre-wrap; word-break: break-word; font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 13.5px; }
.think { background: #f1f3f7; border-left: 3px solid #9aa4b8; color: #4a5468; padding: 4px 8px; margin: 4px 0; }
.answer { background: #eaf6ec; border-left: 3px solid #2e9a4a; padding: 4px 8px; margin: 4px 0; font-weight: 600; }
.tag { display: block; font: 11px system-ui, sans-serif; color: var(--muted); text-transform: uppercase; }
.turn { border: 1px solid var(--line); border-radius: 6px; padding: 6px 8px; margin: 6px 0; }
.turn.assistant { background: #fbfcff; }
.turn.other { background: #fff8ec; }
.verdict { margin-top: 8px; font-weight: 600; }
.verdict.ok { color: #2e9a4a; } .verdict.bad { color: #c0392b; }
.keys { display: flex; flex-wrap: wrap; gap: 8px; margin-top: 14px; }
button { font: inherit; padding: 6px 12px; border: 1px solid var(--line); border-radius: 6px; background: var(--card); cursor: pointer; }
button:hover { border-color: var(--accent); }
kbd { font: 12px ui-monospace, monospace; border: 1px solid var(--line); border-bottom-width: 2px; border-radius: 4px; padding: 0 4px; background: #fafbfc; }
#msg { color: #c0392b; min-height: 1.4em; margin-top: 8px; }
#login { max-width: 420px; margin: 60px auto; background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: 20px; }
#login input { font: inherit; width: 100%; padding: 6px 8px; margin: 8px 0; }
table { border-collapse: collapse; background: var(--card); margin: 8px 0 18px; }
td, th { border: 1px solid var(--line); padding: 4px 10px; text-align: left; }
.hidden { display: none; }
</style></head>
<body data-busy="0">
<header><h1>keelrl judge</h1><div id="bar"><div id="fill"></div></div><div id="count"></div>
<div id="who"></div></header>
<main>
<section id="login" class="hidden"><div class="label">Who is judging?</div>
<p>Your name is kept with each vote (and in this browser, so you are asked once).</p>
<input id="name" autocomplete="off" placeholder="your name"><button id="start">Start</button></section>
<section id="judge" class="hidden">
<div class="label">Prompt</div><div id="prompt" class="prompt"></div>
<div class="sides">
<div class="side" id="side-left"><div class="label">Left</div><div class="text" id="left"></div><div class="verdict" id="v-left"></div></div>
<div class="side" id="side-right"><div class="label">Right</div><div class="text" id="right"></div><div class="verdict" id="v-right"></div></div>
</div>
<div class="keys">
<button data-act="left"><kbd>&larr;</kbd> left is better</button>
<button data-act="right">right is better <kbd>&rarr;</kbd></button>
<button data-act="tie"><kbd>&darr;</kbd>/<kbd>t</kbd> tie</button>
<button data-act="skip"><kbd>s</kbd> skip</button>
<button data-act="undo"><kbd>u</kbd>/<kbd>&#9003;</kbd> undo</button>
<button data-act="verdict"><kbd>v</kbd> verifier's verdict</button>
</div></section>
<section id="results" class="hidden"></section>
<div id="msg"></div>
</main>
<script>
"use strict";
const KEY = "keelrl-judge-name";
let judge = localStorage.getItem(KEY) || "";
let current = null;
let busy = false;
const $ = (id) => document.getElementById(id);

function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined) node.textContent = text;
  return node;
}

function setBusy(flag) { busy = flag; document.body.dataset.busy = flag ? "1" : "0"; }
function say(text) { $("msg").textContent = text || ""; }

async function api(path, body) {
  const init = body === undefined ? {} : {method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(body)};
  const res = await fetch(path, init);
  const data = await res.json();
  if (!res.ok) throw new Error(data.error || res.statusText);
  return data;
}

// <think> and <answer> blocks as boxes, the rest as plain text; an unclosed block runs to the end.
function renderSegments(parent, text) {
  const re = /<(think|answer)>([\s\S]*?)(?:<\/\1>|$)/g;
  let last = 0, m;
  while ((m = re.exec(text)) !== null) {
    if (m.index > last) parent.appendChild(el("span", "", text.slice(last, m.index)));
    const box = el("div", m[1]);
    box.appendChild(el("span", "tag", m[1]));
    box.appendChild(document.createTextNode(m[2]));
    parent.appendChild(box);
    last = re.lastIndex;
    if (m[0].length === 0) re.lastIndex++;
  }
  if (last < text.length) parent.appendChild(el("span", "", text.slice(last)));
}

// Role-tagged turns (<|im_start|>role\n...<|im_end|>) as a transcript; anything else as one text.
function renderText(parent, text) {
  parent.textContent = "";
  const re = /<\|im_start\|>([^\n]*)\n([\s\S]*?)(?:<\|im_end\|>|(?=<\|im_start\|>)|$)/g;
  const turns = [];
  let m;
  while ((m = re.exec(text)) !== null) {
    turns.push([m[1].trim() || "turn", m[2]]);
    if (re.lastIndex >= text.length) break;
  }
  if (!turns.length) { renderSegments(parent, text); return; }
  for (const [role, body] of turns) {
    const turn = el("div", "turn " + (role === "assistant" ? "assistant" : "other"));
    turn.appendChild(el("span", "tag", role));
    renderSegments(turn, body.replace(/^\n+|\n+$/g, ""));
    parent.appendChild(turn);
  }
}

function progress(s) {
  $("fill").style.width = (s.total ? 100 * s.done / s.total : 0) + "%";
  $("count").textContent = s.done + " / " + s.total;
  document.body.dataset.done = String(s.done);
}

function show(s) {
  progress(s);
  current = s.pair;
  document.body.dataset.pair = current ? String(current.id) : "none";
  for (const side of ["left", "right"]) { $("v-" + side).textContent = ""; $("v-" + side).className = "verdict"; }
  if (!current) { $("judge").classList.add("hidden"); showResults(); return; }
  clearTimeout(waiting);
  document.body.dataset.results = "";
  $("results").classList.add("hidden");
  $("judge").classList.remove("hidden");
  $("prompt").textContent = current.prompt;
  renderText($("left"), current.left);
  renderText($("right"), current.right);
}

function cell(row, text, tag) { row.appendChild(el(tag || "td", "", text)); }
function fmt(x, digits) { return x === null || x === undefined ? "n/a" : Number(x).toFixed(digits); }

let waiting = null;
async function showResults() {
  const box = $("results");
  clearTimeout(waiting);
  let r;
  try { r = await api("/api/results"); } catch (err) { say("results: " + err.message); return; }
  if (current) return;  // an undo brought a pair back while the results were asked for
  box.textContent = "";
  box.classList.remove("hidden");
  const same = "Pairs with identical texts on both sides, recorded as ties without asking: " + r.identical_pairs + ".";
  if (!r.finished) {
    const left = Object.entries(r.progress).filter(([, done]) => done < r.total).map(([j, done]) => j + " " + done + "/" + r.total);
    box.appendChild(el("h2", "", "Done: thank you."));
    box.appendChild(el("p", "", "The models' names and the results appear when every judge has finished (waiting for " + left.join(", ") + "). " + same));
    document.body.dataset.results = "waiting";
    waiting = setTimeout(showResults, 5000);
    return;
  }
  box.appendChild(el("h2", "", "Done: thank you. Results (model names revealed)"));
  box.appendChild(el("p", "", same));
  const rank = el("table");
  const head = el("tr");
  for (const h of ["rank", "model", "name", "BT log-strength", "95% interval"]) cell(head, h, "th");
  rank.appendChild(head);
  for (const x of r.ranking) {
    const row = el("tr");
    for (const v of [x.rank, x.model, x.name, fmt(x.log_strength, 2), "[" + fmt(x.lo, 2) + ", " + fmt(x.hi, 2) + "]"]) cell(row, String(v));
    rank.appendChild(row);
  }
  box.appendChild(rank);
  const pw = el("table");
  const ph = el("tr");
  for (const h of ["pair", "win rate of first", "95% Wilson", "wins / ties / losses"]) cell(ph, h, "th");
  pw.appendChild(ph);
  for (const p of r.pairwise) {
    const row = el("tr");
    for (const v of [p.a + " vs " + p.b, fmt(p.rate, 2), "[" + fmt(p.lo, 2) + ", " + fmt(p.hi, 2) + "]", p.wins + " / " + p.ties + " / " + p.losses]) cell(row, String(v));
    pw.appendChild(row);
  }
  box.appendChild(pw);
  box.appendChild(el("p", "", "Judges agree: " + fmt(r.judge_agreement.agreement, 2) + " (" + r.judge_agreement.judge_pairs + " judge pairs). " +
    "People prefer the verifier's accepted completion: " + fmt(r.verifier_agreement.agreement, 2) + " (" + r.verifier_agreement.votes + " votes)."));
  box.appendChild(el("p", "", "Press u to undo your last vote."));
  document.body.dataset.results = "shown";
}

async function refresh() {
  setBusy(true);
  try { show(await api("/api/state?judge=" + encodeURIComponent(judge))); say(""); }
  catch (err) { say("could not load: " + err.message); }
  finally { setBusy(false); }
}

async function act(what) {
  if (busy || !judge) return;
  if (what === "undo") {
    setBusy(true);
    try { show(await api("/api/undo", {judge})); say(""); } catch (err) { say("undo failed: " + err.message); }
    finally { setBusy(false); }
    return;
  }
  if (!current) return;
  if (what === "verdict") {
    setBusy(true);
    try {
      const v = await api("/api/verdict?pair=" + current.id + "&judge=" + encodeURIComponent(judge));
      for (const side of ["left", "right"]) {
        const ok = v[side];
        $("v-" + side).textContent = ok === null ? "verifier: no verdict" : ok ? "verifier: accepted" : "verifier: rejected";
        $("v-" + side).className = "verdict " + (ok ? "ok" : "bad");
      }
    } catch (err) { say("verdict failed: " + err.message); } finally { setBusy(false); }
    return;
  }
  setBusy(true);
  if (what === "left" || what === "right") $("side-" + what).classList.add("picked");
  try { show(await api("/api/vote", {judge, pair_id: current.id, choice: what})); say(""); }
  catch (err) { say("vote not stored: " + err.message); }
  finally { $("side-left").classList.remove("picked"); $("side-right").classList.remove("picked"); setBusy(false); }
}

const KEYS = {ArrowLeft: "left", ArrowRight: "right", ArrowDown: "tie", t: "tie", s: "skip", u: "undo", Backspace: "undo", v: "verdict"};

document.addEventListener("keydown", (e) => {
  if (document.activeElement === $("name")) {
    if (e.key === "Enter") { e.preventDefault(); login(); }
    return;
  }
  if (e.ctrlKey || e.metaKey || e.altKey) return;
  const what = KEYS[e.key];
  if (what) { e.preventDefault(); act(what); }
});
for (const b of document.querySelectorAll("button[data-act]")) b.addEventListener("click", () => act(b.dataset.act));

function login() {
  const name = $("name").value.trim();
  if (!name) { say("please type your name"); return; }
  judge = name;
  localStorage.setItem(KEY, name);
  $("name").blur();
  start();
}

function start() {
  if (!judge) {
    $("login").classList.remove("hidden");
    $("name").focus();
    return;
  }
  $("login").classList.add("hidden");
  const who = $("who");
  who.textContent = "judging as " + judge;
  const change = el("button", "", "change");
  change.addEventListener("click", () => { localStorage.removeItem(KEY); judge = ""; $("judge").classList.add("hidden"); $("results").classList.add("hidden"); who.textContent = ""; start(); });
  who.appendChild(change);
  refresh();
}

$("start").addEventListener("click", login);
start();
</script></body></html>
"""
