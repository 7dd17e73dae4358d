"""Log formats: ``text`` for a terminal, ``json`` (one object per line) for a log pipeline;
chosen by ``REACH_LOG_FORMAT``. Both carry the request id of the request being handled
(``RequestIdLogFilter``); a call's own line (``reach.calls``) carries its fields too."""

from __future__ import annotations

import datetime as dt
import logging

import orjson


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC)
            .isoformat(timespec="milliseconds"),
            "level": record.levelname, "logger": record.name,
            "request_id": getattr(record, "request_id", "-"),
            "message": record.getMessage(),
        }
        call = getattr(record, "call", None)
        if isinstance(call, dict):
            line.update(call)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(line, default=str).decode()
