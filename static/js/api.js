// REST calls and the coalescing of refreshes asked for in a burst.

// A request that hangs this long fails (and may be retried); the page does not wait forever.
const REQUEST_TIMEOUT_MS = 30_000;
// An action not confirmed within this bound says so and offers Retry (it may still land).
export const CONFIRM_MS = 10_000;

export async function api(path, options = {}) {
  const init = { signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS), ...options,
    headers: { accept: "application/json", ...(options.headers || {}) } };
  if (options.body !== undefined && typeof options.body !== "string") {
    init.body = JSON.stringify(options.body);
    init.headers["content-type"] = "application/json";
  }
  const r = await fetch(path, init);
  const data = r.headers.get("content-type")?.includes("json") ? await r.json() : null;
  if (!r.ok) {
    const err = new Error(data?.detail || data?.title || `${r.status} ${r.statusText}`);
    err.status = r.status;
    err.data = data;  // the problem's other fields (e.g. `field`, `errors`: which input is wrong)
    throw err;
  }
  return data;
}

// one wake-up per kind per burst
const pending = new Map();
export function soon(name, fn, ms = 150) {
  if (pending.has(name)) return;
  pending.set(name, setTimeout(async () => { pending.delete(name); try { await fn(); } catch (e) { console.warn(name, e); } }, ms));
}

// one render per kind per frame, run just before the browser paints: what a stream event changed is on
// screen in the next frame (not after a fixed delay), and a burst of events still costs one render. A
// hidden page gets no frames, so the timer stands in for them there.
const FRAME_FALLBACK_MS = 250;
const framed = new Map();
export function nextFrame(name, fn) {
  if (framed.has(name)) return;
  const run = () => {
    const f = framed.get(name);
    if (!f) return;
    framed.delete(name);
    cancelAnimationFrame(f.raf);
    clearTimeout(f.timer);
    try { fn(); } catch (e) { console.warn(name, e); }
  };
  framed.set(name, { raf: requestAnimationFrame(run), timer: setTimeout(run, FRAME_FALLBACK_MS) });
}

// Awaits an action; calls onLate once if the store has not confirmed it within the bound.
export async function confirmed(promise, onLate, ms = CONFIRM_MS) {
  const timer = setTimeout(onLate, ms);
  try { return await promise; } finally { clearTimeout(timer); }
}

// 4xx: the server refused (revert and show its message); anything else may be retried
export const refused = (e) => e.status >= 400 && e.status < 500;
