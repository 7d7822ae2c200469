// Files in the composer: from the camera, the photo library or the disk, a pasted or dropped image. Each
// uploads at once (POST /api/attachments) with its progress on screen; a message goes only with every one
// of its files stored, so a dropped connection never sends a message without its attachment: the file says
// "not uploaded" with Retry, and Send explains what is missing.
import { $, h } from "./dom.js";
import { S } from "./state.js";

// what the pickers offer; the server decides the type from the bytes whatever the picker let through
export const ACCEPT = "image/png,image/jpeg,image/webp,image/gif,application/pdf,text/plain,.txt,.log,.md,.csv,.json,"
  + ".yaml,.yml,.toml,.py,.js,.ts,.go,.rs,.java,.c,.h,.sh,.sql,.diff,.patch,.xml,.html,.css";
const UPLOAD_TIMEOUT_MS = 120_000;

const drafts = [];  // the composer's files, in the order they were added

const limit = () => S.info?.attachment_max_bytes ?? 10 * 1024 * 1024;
const messageLimit = () => S.info?.message_attachments_max_bytes ?? 20 * 1024 * 1024;
export const isImage = (type) => /^image\/(png|jpeg|webp|gif)$/.test(type || "");

// in the units the limits are documented in (10 MiB), as the server's refusals say them
export function size(n) {
  if (n < 1024) return `${n} B`;
  if (n < 1024 * 1024) return `${Math.round(n / 1024)} KiB`;
  return `${(n / 1024 / 1024).toFixed(1).replace(/\.0$/, "")} MiB`;
}

// a refusal a second try cannot change (too large, a type not taken, unreadable): no Retry; a timeout or
// a busy server (408, 429) can pass later
const settled = (status) => status >= 400 && status < 500 && status !== 408 && status !== 429;

export function addFiles(list) {
  for (const file of list) {
    const draft = { key: crypto.randomUUID(), file, name: file.name || `pasted-${drafts.length + 1}.png`,
      size: file.size, type: file.type, state: "uploading", progress: 0, error: "", stored: null,
      url: isImage(file.type) ? URL.createObjectURL(file) : null };
    drafts.push(draft);
    if (file.size > limit()) fail(draft, `larger than ${size(limit())}`, true);
    else upload(draft);
  }
  render();
}

function fail(draft, why, refused) {
  draft.state = "failed";
  draft.error = why;
  draft.refused = refused;  // the server said no (type, size): retrying cannot help
}

// XMLHttpRequest, not fetch: only it reports an upload's progress
function upload(draft) {
  draft.state = "uploading";
  draft.progress = 0;
  draft.error = "";
  const form = new FormData();
  form.append("file", draft.file, draft.name);
  const xhr = new XMLHttpRequest();
  draft.xhr = xhr;
  xhr.open("POST", "/api/attachments");
  xhr.setRequestHeader("accept", "application/json");
  xhr.timeout = UPLOAD_TIMEOUT_MS;
  xhr.upload.onprogress = (ev) => {
    if (!ev.lengthComputable) return;
    draft.progress = ev.loaded / ev.total;
    const bar = document.querySelector(`[data-draft="${draft.key}"] progress`);
    if (bar) bar.value = draft.progress;
  };
  xhr.onload = () => {
    let body = null;
    try { body = JSON.parse(xhr.responseText); } catch { /* not JSON: the status says enough */ }
    if (xhr.status === 201) { draft.state = "stored"; draft.stored = body; }
    else fail(draft, body?.detail || `${xhr.status} ${xhr.statusText}`, settled(xhr.status));
    render();
  };
  xhr.onerror = () => { fail(draft, "the upload was interrupted", false); render(); };
  xhr.ontimeout = () => { fail(draft, "the upload timed out", false); render(); };
  xhr.onabort = () => {};
  xhr.send(form);
}

function remove(draft) {
  const i = drafts.indexOf(draft);
  if (i < 0) return;
  drafts.splice(i, 1);
  if (draft.state === "uploading") draft.xhr?.abort();
  if (draft.url) URL.revokeObjectURL(draft.url);
  render();
  $("#composer-text").focus();
}

// What a message about to be sent carries: the stored files, or why it cannot go yet.
export function ready() {
  const waiting = drafts.filter((d) => d.state === "uploading");
  const failed = drafts.filter((d) => d.state === "failed");
  const total = drafts.reduce((n, d) => n + (d.stored?.size ?? d.size), 0);
  let why = "";
  if (waiting.length) why = `wait: ${waiting.length === 1 ? "a file is" : `${waiting.length} files are`} still uploading`;
  else if (failed.length) why = `${failed.map((d) => d.name).join(", ")} did not upload: retry or remove ${failed.length === 1 ? "it" : "them"}`;
  else if (total > messageLimit()) why = `the files come to ${size(total)}; one message carries at most ${size(messageLimit())}`;
  return { why, files: why ? [] : drafts.map((d) => ({ ...d.stored, url: d.url })) };
}

// Sent: the composer lets go of its files (their previews now belong to the message on screen).
export function takeAll() { drafts.length = 0; render(); }

// A message the server refused comes back into the composer with its files.
export function restore(files) {
  for (const f of files) {
    drafts.push({ key: crypto.randomUUID(), file: null, name: f.name, size: f.size, type: f.media_type,
      state: "stored", progress: 1, error: "", stored: f, url: f.url });
  }
  render();
}

export const count = () => drafts.length;

const HELD = "Not sent yet: ";

function render() {
  const list = $("#composer-files");
  list.replaceChildren(...drafts.map(draftItem));
  list.hidden = !drafts.length;
  // a message held back for its files: the reason follows the files (gone once they are all stored)
  const error = $("#composer-error");
  if (error.textContent.startsWith(HELD)) error.textContent = ready().why ? HELD + ready().why : "";
}

// Why a message cannot go yet, shown under the composer; nothing when it can.
export function held() {
  const { why } = ready();
  if (why) $("#composer-error").textContent = HELD + why;
  return Boolean(why);
}

function draftItem(d) {
  const retry = d.state === "failed" && !d.refused && d.file
    ? h("button", { type: "button", class: "secondary small", onclick: () => { upload(d); render(); } }, "Retry") : null;
  const remover = h("button", { type: "button", class: "remove", "aria-label": `Remove ${d.name}`, onclick: () => remove(d) }, "×");
  // a file that did not upload is one line: its name, why, Retry where a retry can succeed, remove
  if (d.state === "failed") {
    return h("li", { class: "draft failed", "data-draft": d.key, title: `${d.name} — not uploaded: ${d.error}` },
      h("span", { class: "line", role: "alert" }, h("b", { class: "name" }, d.name),
        h("span", { class: "why" }, `: ${d.error}`), h("span", { class: "sr" }, " (not uploaded)")),
      retry, remover);
  }
  return h("li", { class: `draft ${d.state}`, "data-draft": d.key, title: d.name },
    d.url ? h("img", { src: d.url, alt: d.name }) : h("span", { class: "file-icon", "aria-hidden": "true" }, extension(d.name)),
    h("span", { class: "name" }, d.name),
    d.state === "uploading" ? h("progress", { max: 1, value: d.progress, "aria-label": `uploading ${d.name}` }) : null,
    remover);
}

const extension = (name) => (String(name).split(".").pop() || "file").slice(0, 4).toUpperCase();

// The files a message was sent with, in Chat: images shown (served from the store), others as a download.
// A purged file says so instead of a broken image.
export function sentFiles(files) {
  if (!files?.length) return null;
  return h("div", { class: "sent-files" }, files.map((f) => {
    const href = `/api/attachments/${f.id}`;
    if (isImage(f.media_type)) {
      const img = h("img", { src: f.url || href, alt: f.name, loading: "lazy",
        onerror: () => img.replaceWith(h("span", { class: "meta" }, `${f.name} (no longer stored)`)) });
      return h("a", { href, target: "_blank", rel: "noopener", class: "sent-image" }, img);
    }
    return h("a", { href, download: f.name, class: "sent-file" }, `${f.name} (${size(f.size ?? 0)})`);
  }));
}

// The pickers, paste into the composer and a drop anywhere on Chat.
export function wire() {
  for (const id of ["#attach-camera", "#attach-files"]) {
    const input = $(id);
    input.addEventListener("change", () => { addFiles([...input.files]); input.value = ""; });
  }
  $("#attach-files").accept = ACCEPT;
  $("#attach-camera-button").addEventListener("click", () => $("#attach-camera").click());
  $("#attach-files-button").addEventListener("click", () => $("#attach-files").click());
  $("#composer-text").addEventListener("paste", (ev) => {
    const files = [...(ev.clipboardData?.files || [])];
    if (!files.length) return;
    ev.preventDefault();  // the file, not its name as text
    addFiles(files);
  });
  const zone = $("#view-chat");
  const carriesFiles = (ev) => [...(ev.dataTransfer?.types || [])].includes("Files");
  zone.addEventListener("dragover", (ev) => { if (carriesFiles(ev)) { ev.preventDefault(); zone.classList.add("dropping"); } });
  zone.addEventListener("dragleave", (ev) => { if (ev.target === zone) zone.classList.remove("dropping"); });
  zone.addEventListener("drop", (ev) => {
    zone.classList.remove("dropping");
    if (!carriesFiles(ev)) return;
    ev.preventDefault();
    addFiles([...ev.dataTransfer.files]);
  });
}
