// The expert view: grade (question, passage) pairs of the annotation queue 2 / 1 / 0, with an optional expected
// answer, from the keyboard. Token and name stay in this tab's session storage; nothing comes from elsewhere.
"use strict";
const $ = (id) => document.getElementById(id);
const GRADES = { 2: "relevant", 1: "partially relevant", 0: "irrelevant" };
let shown = null;     // the queue item on screen
let busy = false;     // one request at a time: a held key must not label the next item unseen
const labelled = [];  // this tab's labels, newest last: what `u` undoes

(function readLogin() {
  const fromHash = new URLSearchParams(location.hash.slice(1)).get("token");
  if (fromHash) { sessionStorage.setItem("expertToken", fromHash); history.replaceState(null, "", location.pathname); }
  $("expert-token").value = sessionStorage.getItem("expertToken") || "";
  $("expert-name").value = sessionStorage.getItem("expertName") || "";
})();

const expert = () => $("expert-name").value.trim();

function status(text, isError = false) {
  $("status").textContent = text;
  $("status").className = isError ? "error" : "";
}

async function call(method, path, body) {
  const response = await fetch(path, {
    method,
    headers: { "Content-Type": "application/json", "Authorization": "Bearer " + $("expert-token").value.trim() },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const data = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(data.error || response.statusText);
  return data;
}

function showProgress(p) {
  $("progress-box").hidden = false;
  $("progress").max = Math.max(p.total, 1);
  $("progress").value = p.labelled;
  $("progress-text").textContent =
    `${p.labelled} / ${p.total} labelled · ${p.labelled_since_queue} since this queue was built · ${p.by_you} by you`;
}

function show(item) {
  if (shown === null || item === null || shown.question !== item.question) $("expected").value = "";
  shown = item;
  $("item").hidden = item === null;
  if (item === null) return;
  $("item-question").textContent = item.question;
  $("item-doc").textContent = item.doc_id;
  const pages = item.page_start === null ? "" : item.page_start === item.page_end ? `p. ${item.page_start}` : `pp. ${item.page_start}-${item.page_end}`;
  $("item-pages").textContent = pages;
  highlight($("item-passage"), item.text, "", item.question);
}

// The next unlabelled item, or `again` (an item whose label was just undone) with fresh progress.
async function next(again = null) {
  const batch = await call("GET", `/annotation/next?expert=${encodeURIComponent(expert())}&limit=1`);
  showProgress(batch.progress);
  show(again || batch.items[0] || null);
  return shown === null ? " Every item of the queue is labelled. Thank you!" : "";
}

async function guarded(work) {
  if (busy) return;
  busy = true;
  try { await work(); } catch (err) { status(err.message, true); } finally { busy = false; }
}

function label(grade) {
  if (shown === null) return;
  guarded(async () => {
    const item = shown;
    const ack = await call("POST", "/annotation/labels", {
      item_id: item.item_id, grade, expert: expert(), idempotency_key: crypto.randomUUID(),
      expert_answer: $("expected").value.trim() || null,
    });
    labelled.push(item);
    $("undo").disabled = false;
    // The grade the server stored (a retry answers with the first label's), in words and as the key that gives it.
    status(`Saved: ${GRADES[ack.grade]} (${ack.grade}).` + await next());
  });
}

function undo() {
  const item = labelled[labelled.length - 1];
  if (!item) { status("Nothing to undo in this tab.", true); return; }
  guarded(async () => {
    await call("POST", "/annotation/undo", { item_id: item.item_id, expert: expert(), idempotency_key: crypto.randomUUID() });
    labelled.pop();
    $("undo").disabled = labelled.length === 0;
    await next(item);
    status("Undone: the item is unlabelled again; grade it anew.");
  });
}

const start = () => guarded(async () => status(`Labelling as ${expert()}.` + await next()));

$("login").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem("expertName", expert());
  sessionStorage.setItem("expertToken", $("expert-token").value.trim());
  start();
});
document.querySelectorAll("#grades [data-grade]").forEach((b) => b.addEventListener("click", () => label(Number(b.dataset.grade))));
$("undo").addEventListener("click", undo);

$("expected").addEventListener("keydown", (event) => {
  if (event.key !== "Enter" && event.key !== "Escape") return;
  event.preventDefault();
  $("expected").blur();
  if ($("expected").value.trim()) status("Answer kept: grade the passage (2 / 1 / 0) to send it with the label.");
});

document.addEventListener("keydown", (event) => {
  if (event.ctrlKey || event.metaKey || event.altKey || event.target.matches("input, textarea")) return;
  if (Object.hasOwn(GRADES, event.key)) { event.preventDefault(); label(Number(event.key)); }
  else if (event.key === "u" || event.key === "U") { event.preventDefault(); undo(); }
});

if ($("expert-token").value && expert()) start();
