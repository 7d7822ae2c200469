// Asks: the question cards, in the Asks view and docked above the composer in Chat.
import { api, confirmed, refused, soon } from "./api.js";
import { $, firstLine, h, reconcile, short, when } from "./dom.js";
import { preview } from "./markdown.js";
import { S, threadName } from "./state.js";

export async function loadAsks() {
  const [pending, answered] = await Promise.all([api("/api/asks?status=pending&limit=100"),
    api("/api/asks?status=answered&limit=20").catch(() => ({ asks: [] }))]);
  S.asks = pending.asks;
  S.answered = answered.asks;
  renderAsks();
}

// what was chosen, in words: "Left", "Types, Benchmarks", or the reply given instead
export function answerText(answers, response) {
  const one = (v) => (v && typeof v === "object" && !Array.isArray(v) ? v.other : String(v));
  const parts = Object.entries(answers || {}).map(([q, v]) => [q, Array.isArray(v) ? v.map(one).join(", ") : one(v)]);
  return { parts, response: response || null };
}

// An approval: the harness asking whether to start a worker (executor/settle/briefs.py approval_question)
function isApproval(a) {
  const q = a.questions?.[0];
  return a.asked_by === "harness" && a.questions.length === 1 && !q.multiSelect
    && q.options?.length === 2 && q.options[0].label === "Approve" && q.options[1].label === "Reject";
}

function askThread(a) { return a.thread_scope; }

// Cards are kept by ask id across re-renders, so a wake-up never wipes a half-filled answer.
const cardCache = { list: new Map(), pinned: new Map() };

// A notification's link to one card (#asks/<id>): that card, in view and focused, once the asks have loaded
export function showAsk(id) {
  const card = document.querySelector(`#ask-cards form[data-ask-id="${CSS.escape(id)}"]`)
    || document.querySelector(`#ask-history li[data-ask-id="${CSS.escape(id)}"]`);
  if (!card) return false;
  card.scrollIntoView({ block: "center" });
  card.focus({ preventScroll: true });
  return true;
}

function cardsFor(asks, cache, where) {
  const keep = new Set(asks.map((a) => a.id));
  for (const id of cache.keys()) if (!keep.has(id)) cache.delete(id);
  return asks.map((a) => { if (!cache.has(a.id)) cache.set(a.id, askCard(a, where)); return cache.get(a.id); });
}

export function renderAsks() {
  const count = S.asks.length;
  const badge = $("#ask-count");
  badge.hidden = count === 0;
  badge.textContent = String(count);
  const scoped = $("#asks-scope").checked;
  const mine = S.asks.filter((a) => askThread(a) === S.thread || S.threadTasks.has(a.task_id));
  const cards = cardsFor(scoped ? mine : S.asks, cardCache.list, "list");
  // reconciled, not replaced: a card being filled in keeps its focus and its place
  placeCards($("#ask-cards"), cards, cards.length ? cards : [h("p", { class: "empty", tabindex: "-1" },
    scoped ? "No questions wait on this thread." : "No questions are waiting. When Claude needs you, they land here.")]);
  const pinned = cardsFor(mine, cardCache.pinned, "pinned");
  // an open card stands in for the composer; with none open (or its card gone) the composer is back, first,
  // so the focus a leaving card hands on can land there
  $("#view-chat").classList.toggle("ask-open", pinned.some((c) => !c.classList.contains("collapsed")));
  placeCards($("#pinned-asks"), pinned, pinned);
  renderHistory(scoped);
}

// Who answered, in words a user knows: the guard records the proxy's user name, or how the page was let in
function answeredBy(a) {
  const where = a.answered_via === "chat" ? "by a chat message" : "on this page";
  if (a.answered_by === "open") return ` ${where}, in open mode (no sign-in)`;
  if (a.answered_by === "token") return ` ${where}, signed in with the access token`;
  if (!a.answered_by || a.answered_by === "unknown") return "";
  if (a.answered_by.startsWith("notification")) return ` from a ${a.answered_by}`;
  return ` by ${a.answered_by}`;
}

// Asks history: what was answered, and with what
function renderHistory(scoped) {
  const list = $("#ask-history");
  const answered = (S.answered || []).filter((a) => !scoped || askThread(a) === S.thread || S.threadTasks.has(a.task_id));
  const items = answered.map((a) => {
    const { parts, response } = answerText(a.answers, a.response);
    return h("li", { "data-ask-id": a.id },
      h("div", { class: "from" }, a.asked_by === "harness" ? "The harness asked" : "Claude asked",
        a.answered_at ? ` · answered ${when(a.answered_at)}` : "", answeredBy(a)),
      parts.map(([q, v]) => h("div", { class: "qa" }, h("span", { class: "q" }, q), " → ", h("b", { class: "answer" }, v))),
      response ? h("div", { class: "qa" }, "reply: ", h("b", { class: "answer" }, response)) : null);
  });
  $("#ask-history-head").hidden = !items.length;
  list.replaceChildren(...items);
}

// Focus follows the cards: a card that leaves with the focus in it hands it to the next card (or the
// composer); a card that arrives while nothing has focus takes it, so a keyboard or screen-reader user
// lands on the question.
function placeCards(container, cards, nodes) {
  const active = document.activeElement;
  const leaving = [...container.children].find((c) => c.matches?.(".ask") && !cards.includes(c)
    && (c.contains(active) || c.dataset.hadFocus === "1"));
  const arriving = cards.find((c) => !c.isConnected);
  reconcile(container, nodes);
  if (container.closest("[hidden]")) return;
  if (leaving) (cards[0] || (container.id === "pinned-asks" ? $("#composer-text") : container.querySelector(".empty"))).focus();
  else if (arriving && (!document.activeElement || document.activeElement === document.body)) arriving.focus();
}

function askCard(a, where) {
  const label = `${where}-ask-${a.id}`;
  const approval = isApproval(a);
  const form = h("form", { class: `ask${approval ? " approval" : ""}`, "data-ask-id": a.id, tabindex: "-1", "aria-labelledby": label });
  const thread = S.threads.find((t) => t.id === askThread(a));
  const who = a.asked_by === "harness" ? "The harness asks" : "Claude asks";
  const from = h("div", { class: "from", id: label }, who,
    thread ? ` · ${threadName(thread)}` : "", a.task_id ? [" · ", h("a", { href: `#task/${a.task_id}` }, `task ${short(a.task_id)}`)] : null,
    a.late ? h("span", { class: "late", title: "Claude stopped waiting; your answer goes to the thread as a message" }, " · late") : null);
  const body = h("div", { class: "body", id: `${label}-body` });
  if (where === "pinned") {
    // docked: a one-line bar that opens in place (the conversation keeps the rest of the screen)
    const more = a.questions.length > 1 ? `+${a.questions.length - 1} more` : "";
    const toggle = h("button", { type: "button", class: "toggle", "aria-expanded": "false", "aria-controls": body.id },
      "Answer");
    toggle.addEventListener("click", () => expand(form, form.classList.contains("collapsed")));
    form.classList.add("collapsed");
    form.append(h("div", { class: "bar" },
      h("span", { class: "summary" }, h("b", {}, `${approval ? "Start a worker?" : who + ":"} `),
        approval ? firstLine(a.questions[0].options[0].preview, 120) : firstLine(a.questions[0]?.question, 120)),
      more ? h("span", { class: "more" }, more) : null, toggle));
  }
  body.append(from);
  const error = h("p", { class: "error", role: "alert" });
  if (approval) {
    const q = a.questions[0];
    const brief = h("div", { class: "brief-text clamped", id: `${label}-brief` }, q.options[0].preview || "");
    const all = h("button", { type: "button", class: "secondary small show-all", "aria-expanded": "false", "aria-controls": brief.id },
      "Show the whole brief");
    all.addEventListener("click", () => {
      const open = brief.classList.toggle("clamped") === false;
      all.setAttribute("aria-expanded", String(open));
      all.textContent = open ? "Show less" : "Show the whole brief";
    });
    body.append(h("p", { class: "q" }, q.question), brief, all);
    const decide = (choice) => submitAnswer(a, { answers: { [q.question]: choice } }, form, error);
    body.append(h("div", { class: "actions" },
      h("button", { type: "button", class: "approve", onclick: () => decide("Approve") }, "Approve"),
      h("button", { type: "button", class: "secondary reject", onclick: () => decide("Reject") }, "Reject"),
      h("button", { type: "button", class: "secondary retry", hidden: true }, "Retry"),
      h("p", { class: "status", role: "status" }), error));
    form.append(body);
    form.addEventListener("submit", (ev) => ev.preventDefault());
    return form;
  }
  a.questions.forEach((q, qi) => {
    const name = `${a.id}-${qi}`;
    const fieldset = h("fieldset", { class: "question", "data-question": q.question });
    fieldset.append(h("legend", { class: "header" }, q.header || "Question"), h("p", { class: "q" }, q.question));
    const options = h("div", { class: "options", role: q.multiSelect ? "group" : "radiogroup" });
    for (const o of q.options) {
      // the preview sits beside the label, so opening it never toggles the choice
      options.append(h("div", { class: "option" },
        h("label", {},
          h("input", { type: q.multiSelect ? "checkbox" : "radio", name, value: o.label }),
          h("span", {}, h("span", { class: "label" }, o.label), o.description ? h("span", { class: "desc" }, o.description) : null)),
        o.preview ? h("details", { class: "preview" }, h("summary", {}, "preview"), preview(o.preview)) : null));
    }
    fieldset.append(options, h("input", { class: "other", name: `${name}-other`, placeholder: "Other (type your own answer)",
      "aria-label": `Other answer to: ${q.question}` }));
    body.append(fieldset);
  });
  body.append(h("div", { class: "actions" },
    h("button", { type: "submit" }, "Submit"),
    h("input", { class: "reply", name: "reply", placeholder: "or reply", "aria-label": "Reply instead" }),
    h("button", { type: "button", class: "secondary dismiss", onclick: () => dismiss(a, form, error) }, "Dismiss"),
    h("button", { type: "button", class: "secondary retry", hidden: true }, "Retry"),
    h("p", { class: "status", role: "status" }), error));
  form.append(body);
  form.addEventListener("submit", (ev) => { ev.preventDefault(); answer(a, form, error); });
  return form;
}

// a docked card opens in place of the composer and closes back to its bar
function expand(form, open) {
  form.classList.toggle("collapsed", !open);
  const toggle = form.querySelector(".bar .toggle");
  toggle.setAttribute("aria-expanded", String(open));
  toggle.textContent = open ? "Later" : "Answer";
  renderAsks();
  if (!open) return toggle.focus();
  // focused without the browser's scroll (that brought the first option up and cut the question off above it):
  // the docked cards show the card from its question
  (form.querySelector(".body input, .body button") || form).focus({ preventScroll: true });
  const dock = form.closest(".pinned-asks");
  if (dock) dock.scrollTop += form.getBoundingClientRect().top - dock.getBoundingClientRect().top;
}

async function answer(a, form, error) {
  const answers = {};
  a.questions.forEach((q, qi) => {
    const name = `${a.id}-${qi}`;
    const other = form.querySelector(`[name="${name}-other"]`).value.trim();
    const picked = [...form.querySelectorAll(`input[name="${name}"]:checked`)].map((i) => i.value);
    if (q.multiSelect) {
      const values = [...picked, ...(other ? [{ other }] : [])];
      if (values.length) answers[q.question] = values;
    } else if (other) answers[q.question] = { other };
    else if (picked.length) answers[q.question] = picked[0];
  });
  if (!Object.keys(answers).length) { error.textContent = "Choose an option or type an answer."; return; }
  const reply = form.querySelector('[name="reply"]').value.trim();
  await submitAnswer(a, { answers, ...(reply ? { response: reply } : {}) }, form, error);
}

async function dismiss(a, form, error) {
  const reply = form.querySelector('[name="reply"]').value.trim();
  if (reply) await submitAnswer(a, { response: reply }, form, error);
  else {
    try { await api(`/api/asks/${a.id}`, { method: "DELETE" }); removeAsk(a.id); } catch (e) { error.textContent = e.message; }
  }
}

// Optimistic answer: the card shows at once that the answer is on its way and leaves when the store has
// it; unconfirmed in time it says so and offers Retry; refused, it comes back with the server's message.
async function submitAnswer(a, body, form, error) {
  const status = form.querySelector(".status");
  const retry = form.querySelector(".retry");
  if (form.contains(document.activeElement)) form.dataset.hadFocus = "1"; // disabling a button drops focus
  for (const b of form.querySelectorAll("button")) b.disabled = true;
  form.classList.add("pending");
  form.setAttribute("aria-busy", "true");
  error.textContent = "";
  status.textContent = "Sending your answer…";
  retry.hidden = true;
  try {
    await confirmed(api(`/api/asks/${a.id}/answer`, { method: "POST", body }), () => {
      status.textContent = "No confirmation yet: the answer may not have arrived.";
      retry.hidden = false;
      retry.disabled = false;
      retry.onclick = () => submitAnswer(a, body, form, error);
    });
    removeAsk(a.id);
  } catch (e) {
    form.classList.remove("pending");
    form.removeAttribute("aria-busy");
    status.textContent = "";
    for (const b of form.querySelectorAll("button")) b.disabled = false;
    if (refused(e)) {
      retry.hidden = true;
      error.textContent = e.message;
      soon("asks", loadAsks);
    } else {
      error.textContent = `Not sent: ${e.message}`;
      retry.hidden = false;
      retry.onclick = () => submitAnswer(a, body, form, error);
    }
  }
}

function removeAsk(id) { S.asks = S.asks.filter((x) => x.id !== id); renderAsks(); }
