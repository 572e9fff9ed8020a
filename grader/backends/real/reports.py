"""What went wrong in a real group, in words: a hang, a rank that raised, a rank that died. Shared by the
multiprocessing launcher (group.py) and torchrun's launcher (frontends/launch.py)."""

from __future__ import annotations

import re

# --------------------------------------------------------------------------------------------------------------
# What went wrong in a group, in words (shared by the multiprocessing launcher and torchrun's launch.py).


def _states(payloads, positions: dict) -> list[str]:
    """One line per rank: returned, raised (where), gave up waiting (for what, where), or still running (where)."""
    lines, seen = [], {}
    for r, p in enumerate(payloads):
        if p is None:
            where = positions.get(r, "")
            lines.append(f"  rank {r}: still running" + (f", at {where}" if where else ""))
        elif "error" not in p:
            lines.append(f"  rank {r}: returned")
        elif p.get("waiting") and _is_timeout(p["error"]):
            lines.append(f"  rank {r}: gave up waiting (a deadlock?) in {_waiting_text(p['waiting'])}")
        else:
            head = _first_line(p["error"])
            if head in seen:
                lines.append(f"  rank {r}: raised the same error as rank {seen[head]}")
            else:
                seen[head] = r
                short = head if len(head) <= 200 else head[:197] + "..."
                lines.append(f"  rank {r}: raised {short}" + _at(p["error"]))
    return lines


def _hang_hints(payloads) -> list[str]:
    hints = []
    waits = {r: p["waiting"] for r, p in enumerate(payloads) if p is not None and p.get("waiting")}
    for a, wa in waits.items():
        for b, wb in waits.items():
            if a < b and wa["kind"] == wb["kind"] == "send" and wa["peer"] == b and wb["peer"] == a:
                hints.append(f"ranks {a} and {b} both send first: a blocking send waits for the matching "
                             f"recv, so one side must receive first (or use isend/irecv, or batch_isend_irecv).")
    running = [r for r, p in enumerate(payloads) if p is None]
    if running:
        hints.append(f"rank(s) {running} never reached a communication that would let the others go on: an "
                     f"endless loop, or more work than the time limit allows (--timeout)?")
    returned = [r for r, p in enumerate(payloads) if p is not None and "error" not in p]
    if returned:
        hints.append(f"rank(s) {returned} returned while others still wait for them: did a rank skip a send, "
                     f"recv or collective that its partners make?")
    hints.append("(The simulator reports a deadlock as soon as it happens, naming what each rank waits for: "
                 "grade without --backend to see it there.)")
    return hints


def describe_hang(what: str, payloads, backend: str, timeout: float, positions=None) -> str:
    head = (f"the process group hung: {what} did not finish within {timeout:g} s on {len(payloads)} real "
            f"processes ({backend}, TORCH_DISTRIBUTED_DEBUG=DETAIL):")
    return "\n".join([head] + _states(payloads, positions or {}) + _hang_hints(payloads))


def describe_errors(what: str, payloads, backend: str, timeout: float, positions=None) -> str:
    """The first rank's own error (not a time limit, not a peer gone), with what each other rank was doing; or,
    when every error is a time limit, the hang."""
    errors = [(r, p) for r, p in enumerate(payloads) if p is not None and "error" in p]
    primary = [(r, p) for r, p in errors if not _is_timeout(p["error"]) and not _is_secondary(p["error"])]
    if not primary:  # every error is a time limit (gloo's own, or DETAIL's monitored barrier): a hang
        return describe_hang(what, payloads, backend, timeout, positions)
    r, p = primary[0]
    text = p["error"]
    if "Detected mismatch between collectives" in text:
        text += ("\n(torch.distributed's DETAIL fingerprints: the ranks met in collectives with different ops, "
                 "shapes or dtypes. Every rank of a group must make the same collective calls, with tensors of "
                 "the same shape and dtype, in the same order.)")
    others = [line for line in _states(payloads, positions or {}) if not line.startswith(f"  rank {r}:")]
    note = (f"(raised on rank {r} of {len(payloads)}, a real process on torch.distributed with "
            f"{backend}{'; the other ranks:' if others else ''})")
    return "\n".join([text, note] + others)


def classify(payloads) -> str:
    """'ok', 'not_attempted' (every error is the stub's NotImplementedError) or 'error'."""
    errors = [p for p in payloads if p is None or "error" in p]
    if not errors:
        return "ok"
    if all(p is not None and p["error_type"] == "NotImplementedError" for p in errors):
        return "not_attempted"
    return "error"


def raised_not_implemented(error_text: str) -> NotImplementedError:
    """The NotImplementedError a rank reported as text ('NotImplementedError: p3: write ...\n  at ...'), rebuilt so
    that learner_code.not_implemented_result can say how far along the puzzle is."""
    first = _first_line(error_text)
    return NotImplementedError(first.split("NotImplementedError: ", 1)[1] if "NotImplementedError: " in first else first)


def _is_timeout(text: str) -> bool:
    """gloo's own time limit, or DETAIL's monitored barrier that some ranks never reached."""
    return (bool(re.search(r"[Tt]imed out|timeout|failed to pass monitoredBarrier", text))
            and "Detected mismatch" not in text)


def _is_secondary(text: str) -> bool:
    """An error a rank got because another rank went away (not its own mistake)."""
    return bool(re.search(r"Connection closed by peer|Connection reset|Broken pipe|ECONNRESET", text))


def _first_line(text: str) -> str:
    return text.splitlines()[0] if text else ""


def _at(text: str) -> str:
    """' at p3.py:18 in step: dist.all_reduce(g)': the learner's innermost line in a described exception."""
    at = [line.strip() for line in text.splitlines() if line.strip().startswith("at ")]
    return f" {at[-1]}" if at else ""


def _waiting_text(w: dict) -> str:
    peer = f" {'to' if w['kind'] == 'send' else 'from'} rank {w['peer']}" if w.get("peer") is not None else ""
    return f"{w['kind']}{peer} at {w['site']}"


def _tail(text: str, n: int = 15) -> str:
    lines = [line for line in text.splitlines() if line.strip() and "FutureWarning" not in line
             and "return func(*args, **kwargs)" not in line]
    return "\n".join("    " + line for line in lines[-n:])

