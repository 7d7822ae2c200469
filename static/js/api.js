// REST calls and the coalescing of refreshes asked for in a burst.

export async function api(path, options = {}) {
  const init = { ...options, headers: { accept: "application/json", ...(options.headers || {}) } };
  if (options.body !== undefined && typeof options.body !== "string") {
    init.body = JSON.stringify(options.body);
    init.headers["content-type"] = "application/json";
  }
  const r = await fetch(path, init);
  const data = r.headers.get("content-type")?.includes("json") ? await r.json() : null;
  if (!r.ok) {
    const err = new Error(data?.detail || data?.title || `${r.status} ${r.statusText}`);
    err.status = r.status;
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
