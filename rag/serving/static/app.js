// The web page: ask, show the answer and its passages, send ratings. No build step, no network beyond this server.
"use strict";
const $ = (id) => document.getElementById(id);
const sessionId = sessionStorage.getItem("session") || crypto.randomUUID(); // this tab's label of its session
sessionStorage.setItem("session", sessionId);
// The session the server issued (also kept in its cookie): only ratings and clicks sent under it count for a canary.
const serverSession = () => sessionStorage.getItem("serverSession") || undefined;
let current = null; // the last /ask response

(function readToken() {
  const fromHash = new URLSearchParams(location.hash.slice(1)).get("token");
  if (fromHash) { sessionStorage.setItem("token", fromHash); history.replaceState(null, "", location.pathname); }
  $("token").value = sessionStorage.getItem("token") || "";
  $("token").addEventListener("change", () => sessionStorage.setItem("token", $("token").value.trim()));
  if (!$("token").value) $("token-box").open = true;
})();

function status(text, isError = false) {
  $("status").textContent = text;
  $("status").className = isError ? "error" : "";
}

async function call(method, path, body) {
  const response = await fetch(path, {
    method,
    headers: { "Content-Type": "application/json", "Authorization": "Bearer " + $("token").value.trim() },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const data = await response.json().catch(() => ({}));
  if (!response.ok) throw Object.assign(new Error(data.error || response.statusText), { status: response.status });
  return data;
}
const post = (path, body) => call("POST", path, body);

function choose(group, button) {
  group.querySelectorAll("button").forEach((b) => b.classList.toggle("chosen", b === button));
}

async function sendFeedback(body, group, button) {
  if (!current) { status("Ask a question first: there is no answer to rate.", true); return; }
  try {
    const ack = await post("/feedback", { query_id: current.query_id, idempotency_key: crypto.randomUUID(), session_id: sessionId, session: serverSession(), ...body });
    if (group) choose(group, button);
    status(`Thanks, feedback saved (${ack.event_ids.length} rating${ack.event_ids.length === 1 ? "" : "s"}).`);
  } catch (err) {
    status("Feedback not saved: " + err.message, true);
  }
}

// Takes the last answer, its passages and any correction off the page: once a new question is asked (or asking
// failed), rating what is still on screen would rate the old query.
function clearResult() {
  current = null;
  $("result").hidden = true;
  $("answer").textContent = "";
  $("passages").textContent = "";
  $("correction").value = "";
  $("correction-box").open = false;
  document.querySelectorAll("#result .rate button").forEach((b) => b.classList.remove("chosen"));
}

function render(data) {
  current = data;
  $("answer").textContent = data.answer;
  document.querySelectorAll("#result .rate button").forEach((b) => b.classList.remove("chosen"));
  const list = $("passages");
  list.textContent = "";
  for (const p of data.passages) {
    const item = $("passage-template").content.firstElementChild.cloneNode(true);
    item.dataset.chunkId = p.chunk_id;
    item.classList.toggle("cited", p.cited);
    item.querySelector(".doc").textContent = p.doc_id;
    item.querySelector(".pages").textContent = p.page_start === p.page_end ? `p. ${p.page_start}` : `pp. ${p.page_start}-${p.page_end}`;
    item.querySelector(".cited-flag").textContent = p.cited ? "cited" : "";
    const text = item.querySelector(".text");
    highlight(text, p.text, data.not_in_context ? "" : data.answer, data.question);
    text.addEventListener("click", () => togglePassage(item, data, p));
    const group = item.querySelector(".rate");
    group.querySelector(".up").addEventListener("click", (e) => sendFeedback({ passages: [{ chunk_id: p.chunk_id, score: 1 }] }, group, e.currentTarget));
    group.querySelector(".down").addEventListener("click", (e) => sendFeedback({ passages: [{ chunk_id: p.chunk_id, score: -1 }] }, group, e.currentTarget));
    list.append(item);
  }
  $("result").hidden = false;
}

// Opening a passage shows it in its document (the text around it) with a link to the file at its page, fetched
// afresh each time (the link is signed for a limited time); opening is also recorded as a click, once per answer and
// passage (the idempotency key makes a repeat a duplicate).
function togglePassage(item, data, p) {
  const opening = !item.querySelector(".text").classList.contains("open");
  item.querySelector(".text").classList.toggle("open", opening);
  item.querySelector(".context").hidden = !opening;
  post("/events", { query_id: data.query_id, kind: "click", chunk_id: p.chunk_id, session_id: sessionId, session: serverSession(), idempotency_key: `${data.query_id}:${p.chunk_id}` }).catch(() => {});
  if (opening) showContext(item.querySelector(".context"), p.chunk_id);
}

async function showContext(box, chunkId) {
  const note = box.querySelector(".context-note"), link = box.querySelector(".doc-link");
  note.textContent = "Loading the passage's context…";
  try {
    const c = await call("GET", `/passages/${encodeURIComponent(chunkId)}/context`);
    box.querySelector(".before").textContent = c.before;
    box.querySelector(".here").textContent = c.text;
    box.querySelector(".after").textContent = c.after;
    link.hidden = !c.document_url;
    if (c.document_url) {
      link.href = c.document_url;
      link.textContent = `Open ${c.doc_id}` + (c.document_url.includes("#page=") ? ` at page ${c.page_start}` : "");
    }
    note.textContent = c.document_url ? "" : "The document's file is not available on this server.";
  } catch (err) {
    note.textContent = "No context for this passage: " + err.message;
  }
}

$("ask-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  clearResult();
  const question = $("question").value.trim();
  if (!question) { status("Write a question first: the box is empty.", true); return; }
  $("ask-button").disabled = true;
  status("Searching…");
  try {
    const data = await post("/ask", { question, session_id: sessionId, session: serverSession() });
    if (data.session) sessionStorage.setItem("serverSession", data.session);
    render(data);
    status(`Answered in ${Math.round(data.latency_ms)} ms.`);
  } catch (err) {
    // The server says what is wrong (a question over its limit: the length and the limit); a paste too big to
    // send at all is refused before it is read, so the page gives its length here.
    const why = err.status === 413 ? `the question is ${question.length.toLocaleString("en")} characters, far over ` +
      "the limit: shorten it" : err.message;
    status("Could not answer: " + why, true);
  } finally {
    $("ask-button").disabled = false;
  }
});

const answerGroup = document.querySelector('#result .rate[data-target="answer"]');
$("answer-up").addEventListener("click", (e) => sendFeedback({ answer_score: 1 }, answerGroup, e.currentTarget));
$("answer-down").addEventListener("click", (e) => sendFeedback({ answer_score: -1 }, answerGroup, e.currentTarget));
$("send-correction").addEventListener("click", () => {
  const text = $("correction").value.trim();
  if (!text) { status("Write the corrected answer first.", true); return; }
  sendFeedback({ correction: text, correction_source: $("expert").checked ? "expert" : "user" });
});

// Which versions answer (the server resolves `production` to what was promoted): a line under the page.
(async function showServed() {
  try {
    const response = await fetch("/health");
    const served = (await response.json()).served;
    if (!served) return;
    const parts = [`embedder ${served.embedder || "none"}`, `reranker ${served.reranker}`, `mode ${served.mode}`];
    if (served.strategy) parts.push(`chunks ${served.strategy}`);
    $("served").textContent = "Served: " + parts.join(" · ");
  } catch (err) { /* the footer is informative only; asking works without it */ }
})();
