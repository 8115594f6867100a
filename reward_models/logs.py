"""Log lines of bounded length, whatever a client sends (the reward server, `remote`).

A field of a log line that can hold request content (an error message echoing a prompt, a
reward's exception text, h11's complaint about a header) goes through ``clip``: at most
``LOG_FIELD_CHARS`` characters, line breaks escaped (a client cannot start a forged log line),
and the number of characters cut appended, so a 10 MB prompt costs the log a line of about 2 KB
and the reader still sees that something was cut, and how much. Tracebacks are rendered by the
host's formatter; ``ClipTracebacks`` renders them first, line by line clipped, for the server's
logger (``install``).
"""

from __future__ import annotations

import logging
import traceback

LOG_FIELD_CHARS = 2000  # enough for any message of our own, and for a reward's exception text


def clip(value: object, limit: int = LOG_FIELD_CHARS) -> str:
    """``str(value)`` on one line, cut to ``limit`` characters with the number cut appended."""
    return _cut(str(value).replace("\r", "\\r").replace("\n", "\\n"), limit)


def _cut(text: str, limit: int) -> str:
    """``text`` itself, or its first ``limit`` characters and the number cut."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... [{len(text) - limit:,} more characters]"


def clipped_traceback(error: BaseException, limit: int = LOG_FIELD_CHARS) -> str:
    """The traceback of ``error`` (chained causes included), each line at most ``limit``
    characters plus the count of what was cut: an exception's message can hold a prompt."""
    lines = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    return "\n".join(_cut(line, limit) for line in lines.splitlines())


class ClipTracebacks(logging.Filter):
    """Render a record's exception as ``clipped_traceback`` before any handler formats it.

    A formatter renders ``exc_info`` only when ``exc_text`` is unset, so setting it here bounds
    the traceback in every handler while ``exc_info`` stays on the record for those that read it.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.exc_info[1] is not None and not record.exc_text:
            record.exc_text = clipped_traceback(record.exc_info[1])
        return True


def install(logger: logging.Logger) -> logging.Logger:
    """``logger`` with a ``ClipTracebacks`` filter (added once)."""
    if not any(isinstance(f, ClipTracebacks) for f in logger.filters):
        logger.addFilter(ClipTracebacks())
    return logger


__all__ = ["LOG_FIELD_CHARS", "ClipTracebacks", "clip", "clipped_traceback", "install"]
