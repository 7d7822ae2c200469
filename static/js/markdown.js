// Markdown and previews. Markdown goes through marked (raw HTML escaped, links other than
// http/https/mailto left as text) and then DOMPurify before it touches innerHTML. HTML option previews go
// into a sandboxed iframe that may not run scripts. The server's CSP allows no inline script.
import { Marked } from "../vendor/marked.esm.js";
import DOMPurify from "../vendor/purify.es.mjs";
import { escapeHtml, h } from "./dom.js";

// an allow-list on the raw string: "java\tscript:" or " javascript:" match nothing here
const SAFE_URL = /^(?:https?:\/\/|mailto:)/i;
const markdown = new Marked({ gfm: true, breaks: true, async: false });
markdown.use({ renderer: {
  html: (token) => escapeHtml(token.text ?? token.raw ?? ""),
  link: (token) => (SAFE_URL.test(token.href ?? "") ? false : escapeHtml(token.raw ?? token.text ?? "")),
  // remote images would be blocked by the CSP anyway: a link to the image instead
  image: (token) => (SAFE_URL.test(token.href ?? "")
    ? `<a href="${escapeHtml(token.href)}">${escapeHtml(token.text || token.href)}</a>` : escapeHtml(token.raw ?? "")),
} });
const PURIFY = { ALLOWED_URI_REGEXP: SAFE_URL, FORBID_TAGS: ["style", "form", "input", "button", "textarea", "select"],
  FORBID_ATTR: ["style"] };
DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  if (node.tagName === "A" && node.hasAttribute("href")) {
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noopener noreferrer");
  }
});
// what an HTML mock-up may do inside its frame: show itself, with inline styles and inline images
const PREVIEW_CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; form-action 'none'";

export function md(text) {
  const div = h("div", { class: "md" });
  div.innerHTML = DOMPurify.sanitize(markdown.parse(String(text ?? "")), PURIFY);
  return div;
}

// An option preview: markdown, or (when it starts with a tag) an HTML mock-up shown in a frame that is
// sandboxed without allow-scripts (no script, no same-origin access, no forms, no popups) with its own CSP.
export function preview(text) {
  const value = String(text ?? "");
  if (!/^\s*</.test(value)) return md(value);
  const frame = h("iframe", { class: "html-preview", sandbox: "", referrerpolicy: "no-referrer",
    title: "HTML preview", loading: "lazy" });
  frame.srcdoc = `<!doctype html><meta charset="utf-8"><meta http-equiv="Content-Security-Policy" content="${PREVIEW_CSP}">${value}`;
  return frame;
}
