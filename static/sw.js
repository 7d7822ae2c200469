// petal-dispatch service worker: shows the harness's Web Push notifications, opens the page at the card they
// point to, and sends a question's answer from the notification's buttons. It caches nothing: the page is a
// live view and must come from the server.
self.addEventListener("install", () => self.skipWaiting());
self.addEventListener("activate", (event) => event.waitUntil(self.clients.claim()));

self.addEventListener("push", (event) => {
  let data = {};
  try { data = event.data ? event.data.json() : {}; } catch { data = { body: event.data ? event.data.text() : "" }; }
  event.waitUntil(self.registration.showNotification(data.title || "petal-dispatch", shown(data)));
});

// A notification's options: a question's answers as buttons when it carries its one-use token (the server's
// actions "0", "1": the label at that index of `choices`, the buttons' titles being shortened; "reply": open the
// card), else none
function shown(data) {
  const actions = data.token && Array.isArray(data.actions) ? data.actions : [];
  const choices = actions.length && Array.isArray(data.choices) ? data.choices.map(String) : [];
  return {
    body: data.body || "", tag: data.tag, renotify: Boolean(data.tag), icon: "/icon.svg",
    actions: actions.map((a) => ({ action: String(a.action), title: String(a.title) })),
    data: { url: data.url || "/", token: data.token || null, choices, questionId: data.question_id || null },
  };
}

// The page at `url` (only a page of this origin: a notification never sends the reader anywhere else)
async function openAt(url) {
  let to = self.location.origin + "/";
  try {
    const u = new URL(url || "/", self.location.origin);
    if (u.origin === self.location.origin) to = u.href;
  } catch { /* not a URL: the home page */ }
  const pages = await self.clients.matchAll({ type: "window", includeUncontrolled: true });
  for (const page of pages) {
    if (new URL(page.url).origin === self.location.origin) {
      await page.focus();
      return page.navigate(to);
    }
  }
  return self.clients.openWindow(to);
}

// An answer button pressed: the choice is sent with the notification's token (never the user's credential).
// Answered, or refused because the question was settled meanwhile, the notification is replaced by one that says
// so; anything else opens the page at the card. Returns what happened (the tests call it directly).
async function act(data, action, tag) {
  const choice = data.choices?.[Number(action)];
  if (!data.token || choice === undefined) return openAt(data.url);
  let r;
  try {
    r = await fetch("/api/notify/act", {
      method: "POST", headers: { "Content-Type": "application/json" }, credentials: "omit",
      body: JSON.stringify({ token: data.token, choice }),
    });
  } catch {
    await openAt(data.url);
    return "offline";
  }
  const body = await r.json().catch(() => ({}));
  const say = (title, text) => self.registration.showNotification(title, {
    body: text, tag, icon: "/icon.svg", data: { url: data.url },
  });
  if (r.ok) {
    await say("Answered", `You answered “${choice}”.`);
    return "answered";
  }
  if (r.status === 409 && body.answered_by !== undefined) {
    await say("Already answered", body.answered_by ? `Answered by ${body.answered_by}.` : body.detail || "");
    return "settled";
  }
  await openAt(data.url);
  return `refused ${r.status}`;
}
self.act = act;

self.addEventListener("notificationclick", (event) => {
  const n = event.notification;
  n.close();
  const data = n.data || {};
  const answering = event.action && event.action !== "reply";
  event.waitUntil(answering ? act(data, event.action, n.tag) : openAt(data.url));
});
