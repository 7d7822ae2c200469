// The live journal stream (SSE over fetch, so Last-Event-ID can be set on every reconnect). Journal
// events carry `id: <seq>`; id-less events are wake-ups (re-read a REST view).
import { $, sleep } from "./dom.js";
import { S } from "./state.js";

export function setConn(state) {
  S.conn = state;
  const el = $("#conn");
  el.dataset.state = state;
  el.textContent = { connecting: "connecting…", live: "live", reconnecting: "reconnecting…", offline: "offline" }[state];
}

// handlers: { onEvent(envelope), onWake(kind, payload), onResume() }
export async function stream(handlers) {
  let delay = 500;
  let dropped = false;
  for (;;) {
    setConn(dropped ? "reconnecting" : "connecting");
    try {
      const r = await fetch("/api/stream", {
        headers: { accept: "text/event-stream", "Last-Event-ID": String(S.lastSeq) }, cache: "no-store",
      });
      if (!r.ok || !r.body) throw new Error(`stream ${r.status}`);
      setConn("live");
      delay = 500;
      if (dropped) handlers.onResume(); // wake-ups are not replayed: re-read the views (journal events are)
      await readStream(r.body, handlers);
    } catch (e) {
      console.warn("stream", e);
    }
    dropped = true;
    setConn(navigator.onLine === false ? "offline" : "reconnecting");
    await sleep(delay);
    delay = Math.min(delay * 2, 8000);
  }
}

async function readStream(body, handlers) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += value;
    // events end with a blank line; the server may use CRLF
    let m;
    while ((m = /\r\n\r\n|\n\n|\r\r/.exec(buf))) {
      const block = buf.slice(0, m.index);
      buf = buf.slice(m.index + m[0].length);
      onFrame(block, handlers);
    }
  }
}

function onFrame(block, handlers) {
  let id = null, event = "message", data = "";
  for (const line of block.split(/\r\n|\n|\r/)) {
    if (!line || line.startsWith(":")) continue;
    const i = line.indexOf(":");
    const field = i < 0 ? line : line.slice(0, i);
    const value = i < 0 ? "" : line.slice(i + 1).replace(/^ /, "");
    if (field === "id") id = value;
    else if (field === "event") event = value;
    else if (field === "data") data += (data ? "\n" : "") + value;
  }
  if (!data) return;
  let payload;
  try { payload = JSON.parse(data); } catch { return; }
  if (id !== null) {
    const seq = Number(id);
    if (seq <= S.lastSeq) return; // already seen (a replay overlapping the initial load)
    S.lastSeq = seq;
    handlers.onEvent(payload);
  } else {
    handlers.onWake(event, payload);
  }
}
