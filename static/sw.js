// petal-dispatch service worker: shows the harness's Web Push notifications and opens the page at the
// card they point to. It caches nothing: the page is a live view and must come from the server.
self.addEventListener("install", () => self.skipWaiting());
self.addEventListener("activate", (event) => event.waitUntil(self.clients.claim()));

self.addEventListener("push", (event) => {
  let data = {};
  try { data = event.data ? event.data.json() : {}; } catch { data = { body: event.data ? event.data.text() : "" }; }
  event.waitUntil(self.registration.showNotification(data.title || "petal-dispatch", {
    body: data.body || "", tag: data.tag, renotify: Boolean(data.tag), icon: "/icon.svg", data: { url: data.url || "/" },
  }));
});

self.addEventListener("notificationclick", (event) => {
  event.notification.close();
  // only a page of this origin: a notification never sends the reader anywhere else
  let url = self.location.origin + "/";
  try {
    const to = new URL(event.notification.data?.url || "/", self.location.origin);
    if (to.origin === self.location.origin) url = to.href;
  } catch { /* not a URL: the home page */ }
  event.waitUntil((async () => {
    const pages = await self.clients.matchAll({ type: "window", includeUncontrolled: true });
    for (const page of pages) {
      if (new URL(page.url).origin === self.location.origin) {
        await page.focus();
        return page.navigate(url);
      }
    }
    return self.clients.openWindow(url);
  })());
});
