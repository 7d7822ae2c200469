"""The `claude` CLI's stdout read: each stream-json line typed, what a turn's lines showed, and the status its
exit makes (pure; what it is given is executor/run/substrate.py's).

Ground truth is what the CLI was observed to do (docs/claude-cli.md and the tests against the real
binary): stdout is JSON lines but must be parsed tolerantly; a result's `is_error` changed meaning
between 2.1.x versions, so an `error_*` subtype is a failure whatever `is_error` says, and `subtype:
"success"` is not success when `is_error` is set; SIGTERM exits 143 with no result line.
"""

from __future__ import annotations

import json
import re
import signal
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import orjson

from shared import journal

_TYPE_NAME = re.compile(r"[a-z][a-z0-9_]{0,40}")  # whole names (fullmatch: no trailing newline)
_API_ERROR_TEXT = re.compile(r"\bAPI Error: (\d{3})\b")


class Line(NamedTuple):
    """One typed stdout line (a named tuple: one is built per line of a flood, and a tuple is the cheapest)."""

    event_type: str
    payload: Any
    obj: dict[str, Any] | None
    # the line's own JSON text when jsonb can store it as printed
    payload_json: str | None = None


# A line's "type" (a system line's "subtype") → its event type. A stream has a handful of distinct ones, so
# each is checked against _TYPE_NAME once; bounded, so a stream of ever-new names is typed, just not cached.
_TYPE_CACHE_MAX = 256
_kind_types: dict[str, str] = {}
_system_types: dict[str, str] = {}


def _event_type(cache: dict[str, str], name: str, prefix: str, fallback: str) -> str:
    found = cache.get(name)
    if found is None:
        found = prefix + name if _TYPE_NAME.fullmatch(name) else fallback
        if len(cache) < _TYPE_CACHE_MAX:
            cache[name] = found
    return found


def _parse(text: str) -> tuple[Any, bool]:
    """(value, whether the text is storable as is); (None, False) when it is not JSON."""
    try:
        return orjson.loads(text), journal.storable_json(text)
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(text), False  # e.g. lone surrogates, which orjson refuses
    except (ValueError, RecursionError):  # RecursionError: nested deeper than json's limit (orjson's is 1024)
        return None, False


def classify(raw: bytes) -> Line:
    """Type one stdout line. Anything that is not a JSON object is kept verbatim as stream.unparsed."""
    text = raw.decode("utf-8", errors="replace").rstrip("\r\n").removeprefix("\ufeff")
    obj, storable = _parse(text)
    if not isinstance(obj, dict):
        payload: dict[str, Any] = {"line": text}
        if "\ufffd" in text and b"\xef\xbf\xbd" not in raw:
            payload["invalid_utf8"] = True
        return Line("stream.unparsed", payload, None)
    as_is = text if storable else None
    kind = obj.get("type")
    if not isinstance(kind, str):
        return Line("stream.other", obj, obj, as_is)
    if kind == "system":
        sub = obj.get("subtype")
        if not isinstance(sub, str):
            return Line("stream.system", obj, obj, as_is)
        return Line(_event_type(_system_types, sub, "stream.system.", "stream.system"), obj, obj, as_is)
    return Line(_event_type(_kind_types, kind, "stream.", "stream.other"), obj, obj, as_is)


@dataclass
class TurnFacts:
    """What the stream showed, accumulated line by line (pure; no I/O)."""

    substrate_session_id: str | None = None
    result: dict[str, Any] | None = None
    rate_limited: bool = False
    auth_failed: bool = False
    lines: int = 0
    unparsed: int = 0
    last_text: str = ""
    # the CLI's "[Request interrupted by user…]" line: SIGINT or a control-protocol interrupt
    interrupted: bool = False
    # completed tool calls: what tells a budget stop with work done (partial) from one without
    tool_results: int = 0

    def feed(self, line: Line) -> None:
        self.lines += 1
        obj = line.obj
        if obj is None:
            self.unparsed += line.event_type == "stream.unparsed"
            return
        sid = obj.get("session_id")
        if isinstance(sid, str) and sid and self.substrate_session_id is None:
            self.substrate_session_id = sid
        read = self._readers.get(str(obj.get("type")))
        if read is not None:
            read(self, obj)

    def _api_error(self, error: Any, status: Any) -> None:
        """An API error the CLI reported: a rate limit (429) or a failed login (401)."""
        if error in ("rate_limit", "rate_limit_error") or status == 429:
            self.rate_limited = True
        elif error == "authentication_failed" or status == 401:
            self.auth_failed = True

    def _system(self, obj: dict[str, Any]) -> None:
        if obj.get("subtype") == "api_retry":
            self._api_error(obj.get("error"), obj.get("error_status"))

    def _assistant(self, obj: dict[str, Any]) -> None:
        self._api_error(obj.get("error"), obj.get("api_error_status"))
        texts = [b.get("text", "") for b in (obj.get("message") or {}).get("content") or []
                 if isinstance(b, dict) and b.get("type") == "text"]
        if texts and not obj.get("is_api_error_message"):
            self.last_text = "\n".join(texts)

    def _user(self, obj: dict[str, Any]) -> None:
        content = (obj.get("message") or {}).get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content or []
        for b in blocks:
            if not isinstance(b, dict):
                continue
            if b.get("type") == "tool_result":
                self.tool_results += 1
            elif b.get("type") == "text" and str(b.get("text", "")).startswith(INTERRUPTED_MARK):
                self.interrupted = True

    def _rate_limit_event(self, obj: dict[str, Any]) -> None:
        if ((obj.get("rate_limit_info") or {}).get("status")) == "rejected":
            self.rate_limited = True

    def _result(self, obj: dict[str, Any]) -> None:
        self.result = obj
        self._api_error(obj.get("api_error_type"), obj.get("api_error_status"))
        # older CLIs (2.1.29) give no api_error_status and no api_retry line without retries: only the text
        said = _API_ERROR_TEXT.search(str(obj.get("result") or "")) if obj.get("is_error") else None
        if said:
            self._api_error(None, int(said.group(1)))

    # what each kind of line can tell (the other kinds only count)
    _readers: ClassVar[dict[str, Callable[[TurnFacts, dict[str, Any]], None]]] = {
        "system": _system, "assistant": _assistant, "user": _user, "rate_limit_event": _rate_limit_event,
        "result": _result,
    }

    @property
    def permission_denials(self) -> list[dict[str, Any]]:
        """The result line's denials as the exit's record keeps them: the line is the spawn's word (a process in its
        sandbox can print one), so at most MAX_DENIALS, each with its tool's name, id and a bounded input."""
        denials = (self.result or {}).get("permission_denials")
        if not isinstance(denials, list):
            return []
        return [_denial(d) for d in denials[:MAX_DENIALS] if isinstance(d, dict)]

    def result_summary(self) -> dict[str, Any] | None:
        if self.result is None:
            return None
        keys = ("subtype", "is_error", "terminal_reason", "api_error_status", "num_turns", "stop_reason",
                "duration_ms", "total_cost_usd", "errors")
        return {k: _small(self.result[k]) for k in keys if k in self.result}


# What an exit's record keeps of a result line's fields (the spawn's word): a few denials, short values.
MAX_DENIALS = 50
MAX_VALUE_CHARS = 2_000
MAX_INPUT_CHARS = 8_000


def _small(value: Any) -> Any:
    """A value cut to a record's size: a list to its first 20 items, each item as _scalar keeps it."""
    return [_scalar(v) for v in value[:20]] if isinstance(value, list) else _scalar(value)


def _scalar(value: Any) -> Any:
    if isinstance(value, str):
        return value[:MAX_VALUE_CHARS]
    if isinstance(value, (dict, list)):
        return json.dumps(value)[:MAX_VALUE_CHARS]
    return value


def _denial(d: dict[str, Any]) -> dict[str, Any]:
    """A denial's tool name and id, and its input when that is small (the gate classifies it again at settlement)."""
    tool_input = d.get("tool_input")
    kept: dict[str, Any] = {k: _small(d[k]) for k in ("tool_name", "tool_use_id") if k in d}
    if isinstance(tool_input, dict) and len(json.dumps(tool_input)) <= MAX_INPUT_CHARS:
        kept["tool_input"] = tool_input
    elif tool_input is not None:
        kept["tool_input"] = {"cut": json.dumps(tool_input)[:MAX_VALUE_CHARS]}
    return kept


@dataclass(frozen=True, slots=True)
class Outcome:
    status: str
    reason: str


def signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return str(sig)


_CANCEL_CODES = {128 + signal.SIGTERM, 128 + signal.SIGINT}
_CANCEL_SIGNALS = {signal.SIGTERM, signal.SIGINT}
_ABORTED = {"aborted_streaming", "aborted_tools"}
# the text of the synthetic user line an interrupt leaves ("… for tool use" during a tool)
INTERRUPTED_MARK = "[Request interrupted by user"
# a run the CLI stopped on a budget; with work done it is `partial`, else `failed`
_BUDGET_STOPS = {"error_max_turns": "max_turns", "error_max_budget_usd": "max_budget_usd"}


def derive_status(
    returncode: int | None, facts: TurnFacts, *, stop_requested: bool = False, imported: bool = False,
    gate_denials: int = 0,
) -> Outcome:
    """Exit → status (design.md, D-11). `returncode` < 0 means death by signal -N (asyncio's form);
    None means unknown (an imported transcript). `gate_denials` counts the harness's own `gate.decided`
    refusals: a gate that failed or timed out is missing from the CLI's permission_denials."""
    result = facts.result
    failed_run = (result is None or bool(result.get("is_error")) or returncode not in (0, None)
                  or str(result.get("subtype")).startswith("error_"))
    if stop_requested:
        return Outcome("cancelled", "stop_requested")
    if failed_run and facts.rate_limited:
        return Outcome("rate_limited", "rate_limit")
    if failed_run and facts.auth_failed:
        return Outcome("rate_limited", "auth_failed")
    by_process = _process_outcome(returncode)
    if by_process is not None:
        return by_process
    if result is None:
        if facts.interrupted:  # the CLI sometimes exits after an interrupt without its result line
            return Outcome("cancelled", "interrupted")
        return Outcome("crashed" if imported else "failed", "no_result")
    by_result = _result_outcome(result, facts, returncode)
    if by_result is not None:
        return by_result
    if gate_denials:
        return Outcome("gated", "gate_decisions")
    if facts.permission_denials:
        return Outcome("gated", "permission_denials")
    return Outcome("success", str(result.get("terminal_reason") or "completed"))


def _process_outcome(returncode: int | None) -> Outcome | None:
    """What the exit alone says: a signal, or a shell's 128+N code."""
    if returncode is not None and returncode < 0:
        sig = -returncode
        return Outcome("cancelled" if sig in _CANCEL_SIGNALS else "crashed", f"signal {signal_name(sig)}")
    if returncode in _CANCEL_CODES:
        return Outcome("cancelled", f"exit {returncode}")
    if returncode is not None and returncode > 128:
        return Outcome("crashed", f"exit {returncode}")
    return None


def _result_outcome(result: dict[str, Any], facts: TurnFacts, returncode: int | None) -> Outcome | None:
    """What the result line says of an unsuccessful run: an interrupt, a budget stop, an error."""
    terminal = result.get("terminal_reason")
    subtype = result.get("subtype")
    # is_error of an interrupt or a max-turns stop was false in 2.1.29 and is true since: read the subtype
    if terminal in _ABORTED or (subtype == "error_during_execution" and facts.interrupted):
        return Outcome("cancelled", str(terminal or "interrupted"))
    if subtype in _BUDGET_STOPS:
        return Outcome("partial" if facts.tool_results else "failed", _BUDGET_STOPS[subtype])
    if isinstance(subtype, str) and subtype.startswith("error_"):
        return Outcome("failed", str(terminal or subtype))
    if result.get("is_error") or returncode not in (0, None):
        return Outcome("failed", str(terminal or subtype or f"exit {returncode}"))
    return None
