"""A status the user is meant to see, checked as seen: Playwright's `is_visible()`, a bounding box of
non-zero size, not hidden or made transparent by CSS (on it or an ancestor), inside the viewport, and on
top at its centre (covered by nothing) — with the words it says read as rendered (`innerText`), not as
DOM text that CSS may hide. An attribute or DOM text alone says what the page meant, not what it shows."""

from __future__ import annotations

from playwright.async_api import Locator

from tests.wait import until

# Why the element is not seen, or '' when it is.
_UNSEEN = """(el) => {
  if (!el.checkVisibility({visibilityProperty: true, opacityProperty: true, contentVisibilityAuto: true}))
    return 'hidden by CSS (display, visibility or opacity)';
  for (let e = el; e; e = e.parentElement) {
    const s = getComputedStyle(e);
    if (parseFloat(s.opacity) === 0) return `transparent (${e.tagName.toLowerCase()} has opacity 0)`;
    if (s.clipPath && s.clipPath !== 'none' && e === el) return `clipped (${s.clipPath})`;
  }
  const r = el.getBoundingClientRect();
  if (r.width < 1 || r.height < 1) return `an empty box (${r.width}x${r.height})`;
  if (r.bottom <= 0 || r.right <= 0 || r.top >= innerHeight || r.left >= innerWidth)
    return `off screen (${Math.round(r.left)},${Math.round(r.top)})`;
  const x = Math.min(Math.max(r.left + r.width / 2, 0), innerWidth - 1);
  const y = Math.min(Math.max(r.top + r.height / 2, 0), innerHeight - 1);
  const top = document.elementFromPoint(x, y);
  if (!(top === el || el.contains(top)))
    return `covered by ${top ? top.tagName.toLowerCase() + (top.id ? '#' + top.id : '') : 'nothing hit'}`;
  return '';
}"""


async def _why_unseen(locator: Locator, text: str | None) -> str:
    if await locator.count() != 1:
        return f"{await locator.count()} elements match"
    if not await locator.is_visible():
        return "not visible (Playwright)"
    box = await locator.bounding_box()
    if box is None or box["width"] <= 0 or box["height"] <= 0:
        return f"no bounding box ({box})"
    why: str = await locator.evaluate(_UNSEEN)
    if why:
        return why
    if text is not None and text not in (shown := await locator.inner_text()):
        return f"it shows {shown!r}, not {text!r}"
    return ""


async def seen(locator: Locator, text: str | None = None, *, timeout: float = 10, scroll: bool = False) -> None:
    """Wait until the user sees `locator` (saying `text`, when given); fail saying why not."""
    last = {"why": ""}

    async def check() -> bool:
        if scroll and await locator.count() == 1 and await locator.is_visible():
            # as the user would scroll to it: to the middle, clear of a sticky header
            await locator.evaluate("(el) => el.scrollIntoView({block: 'center'})")
        last["why"] = await _why_unseen(locator, text)
        return last["why"] == ""

    await until(check, lambda: f"{locator} to be seen{f' saying {text!r}' if text else ''}: {last['why']}",
                timeout=timeout, every=0.1)
