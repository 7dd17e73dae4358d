"""Two small, real demo agents that Agent-Reach starts on loopback for a new user.

    agents, stop = run_in_thread()          # synchronous callers (a management command)
    agents, stop = await start_demo_agents() # inside an event loop

* ``demo-chat`` speaks the OpenAI Chat Completions protocol (``POST /v1/chat/completions``,
  plain and SSE streaming) and answers deterministically by echoing the last user message.
* ``demo-translator`` is a plain-HTTP ``POST /translate`` behind a business envelope
  ``{"code", "message", "data"}``; errors come back as HTTP 200 with a non-zero code, as
  many real business APIs do, so the gateway has something genuine to unwrap.

Both serve ``GET /healthz`` and ``GET /_demo/last-requests`` (the headers of the last 100
business requests, so gateway tests can see what reached the agent). No model, no network,
no Django: only ``aiohttp.web``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import threading
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from aiohttp import web

__all__ = [
    "CHAT_AGENT_ID",
    "TRANSLATOR_AGENT_ID",
    "DemoAgent",
    "chat_descriptor",
    "run_in_thread",
    "start_demo_agents",
    "translate",
    "translator_descriptor",
]

CHAT_AGENT_ID = "demo-chat"
TRANSLATOR_AGENT_ID = "demo-translator"

#: How many requests each agent remembers for ``GET /_demo/last-requests``.
RECORDED_REQUESTS = 100
#: Header that makes ``demo-chat`` die mid-stream after that many SSE events.
FAIL_AFTER_HEADER = "X-Demo-Fail-After"
CHAT_SIGNATURE = "(demo-chat agent, reached through Agent-Reach)"
LANGUAGES = ("en", "zh", "ja")

# Streams finish at once on shutdown (see ``_pause``); this only bounds a stuck client,
# which must not hold ``stop()`` for aiohttp's default 60 s.
_SHUTDOWN_TIMEOUT = 1.0
_dumps = partial(json.dumps, ensure_ascii=False)


@dataclass(frozen=True)
class DemoAgent:
    """A running demo agent: its id, the loopback port it listens on, and the JSON
    descriptor that registers it with the platform (its ``reach.endpoint`` is the base URL)."""

    name: str
    port: int
    # Excluded from the hash: a dict is unhashable, and name + port identify the agent.
    descriptor: dict[str, Any] = field(hash=False)

    @property
    def base_url(self) -> str:
        """``http://host:port`` without a trailing slash."""
        return str(self.descriptor["reach"]["endpoint"]).rstrip("/")


# --------------------------------------------------------------------------- descriptors

_LIVENESS = {"ttl_seconds": 30, "heartbeat_interval_seconds": 10}


def chat_descriptor(endpoint: str) -> dict[str, Any]:
    """The platform descriptor of ``demo-chat`` reachable at ``endpoint`` (a fresh dict)."""
    return {
        "agent_id": CHAT_AGENT_ID,
        "version": "1.0.0",
        "description": (
            "Demo OpenAI-compatible chat agent started with Agent-Reach: it echoes your "
            "last message deterministically (no model behind it)."
        ),
        "team": "demo",
        "reach": {"protocol": "openai", "endpoint": endpoint},
        "liveness": dict(_LIVENESS),
        "capabilities": [
            {
                "id": "chat.general",
                "display_name": "General chat",
                "description": "Friendly general-purpose chat assistant (demo)",
                "keywords": ["chat", "talk", "聊天", "assistant"],
                "kind": "stream",
                "timeout_ms": 15000,
                "path": "/v1/chat/completions",
            }
        ],
    }


def translator_descriptor(endpoint: str) -> dict[str, Any]:
    """The platform descriptor of ``demo-translator`` reachable at ``endpoint`` (a fresh
    dict). ``capabilities[0].response.envelope`` tells the gateway how to unwrap replies."""
    return {
        "agent_id": TRANSLATOR_AGENT_ID,
        "version": "1.0.0",
        "description": (
            "Demo translator started with Agent-Reach: a small built-in phrase dictionary "
            "between English, Chinese and Japanese, behind a business envelope."
        ),
        "team": "demo",
        "reach": {"protocol": "http", "endpoint": endpoint},
        "liveness": dict(_LIVENESS),
        "capabilities": [
            {
                "id": "translate.text",
                "display_name": "Text translation",
                "description": (
                    "Translate short text between English, Chinese and Japanese (demo)"
                ),
                "keywords": ["translate", "翻译", "译成"],
                "languages": list(LANGUAGES),
                "direction": ["en->zh", "zh->en", "en->ja", "ja->en", "zh->ja", "ja->zh"],
                "input_schema": {
                    "type": "object",
                    "properties": {
                        "text": {"type": "string", "minLength": 1},
                        "target_lang": {"type": "string", "enum": list(LANGUAGES)},
                    },
                    "required": ["text", "target_lang"],
                    "additionalProperties": False,
                },
                "output_schema": {
                    "type": "object",
                    "properties": {
                        "message": {"type": "string"},
                        "source_lang": {"type": "string"},
                    },
                    "required": ["message"],
                },
                "timeout_ms": 5000,
                "path": "/translate",
                "kind": "sync",
                "response": {
                    "envelope": {
                        "code_field": "code",
                        "ok_value": 0,
                        "data_field": "data",
                        "message_field": "message",
                    }
                },
            }
        ],
    }


# ------------------------------------------------------------------ shared: health, recording

_REQUEST_LOG: web.AppKey[deque[dict[str, Any]]] = web.AppKey("demo_request_log", deque)
_CHUNK_DELAY: web.AppKey[float] = web.AppKey("demo_chunk_delay", float)
_CLOSING: web.AppKey[asyncio.Event] = web.AppKey("demo_closing", asyncio.Event)


def _is_bookkeeping(path: str) -> bool:
    # Health polls and the log itself would drown the requests the gateway actually sent.
    return path == "/healthz" or path.startswith("/_demo/")


@web.middleware
async def _record_request(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Remember method, path, query and headers of every non-bookkeeping request, before
    the handler runs, so even rejected or aborted requests are visible."""
    if not _is_bookkeeping(request.path):
        headers: dict[str, str] = {}
        for name, value in request.headers.items():
            # Header names are case-insensitive: lower-case them so lookups are exact;
            # repeated headers are folded the way RFC 9110 allows.
            key = name.lower()
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        request.app[_REQUEST_LOG].append(
            {
                "method": request.method,
                "path": request.path,
                "query": request.query_string,
                "headers": headers,
            }
        )
    return await handler(request)


async def _mark_closing(app: web.Application) -> None:
    # aiohttp runs on_shutdown hooks after the listener closed and before it waits for
    # in-flight handlers: the moment to tell streams to stop pausing.
    app[_CLOSING].set()


async def _pause(app: web.Application) -> None:
    """Sleep the configured chunk delay, cut short when the agent is shutting down."""
    delay, closing = app[_CHUNK_DELAY], app[_CLOSING]
    if delay <= 0 or closing.is_set():
        return
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(delay):
            await closing.wait()


async def _healthz(request: web.Request) -> web.Response:
    """``GET /healthz`` → 200 ``{"status": "ok"}``."""
    return web.json_response({"status": "ok"})


async def _last_requests(request: web.Request) -> web.Response:
    """``GET /_demo/last-requests`` → the recorded requests, oldest first (at most 100)."""
    return web.json_response(list(request.app[_REQUEST_LOG]), dumps=_dumps)


def _base_app(chunk_delay: float) -> web.Application:
    app = web.Application(middlewares=[_record_request])
    app[_REQUEST_LOG] = deque(maxlen=RECORDED_REQUESTS)
    app[_CHUNK_DELAY] = chunk_delay
    app[_CLOSING] = asyncio.Event()
    app.on_shutdown.append(_mark_closing)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/_demo/last-requests", _last_requests)
    return app


async def _json_body(request: web.Request) -> Any:
    """The request body parsed as JSON, whatever its Content-Type. Raises ``ValueError``
    (covers bad UTF-8 and bad JSON alike) when it is not JSON."""
    raw = await request.read()
    return json.loads(raw.decode("utf-8"))


# ------------------------------------------------------------------------------- demo-chat

_WORD = re.compile(r"\s*\S+")


class _BadRequest(Exception):
    """An invalid Chat Completions request; ``param`` names the offending field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


def _openai_error(message: str, param: str | None = None, status: int = 400) -> web.Response:
    return web.json_response(
        {
            "error": {
                "message": message,
                "type": "invalid_request_error",
                "param": param,
                "code": None,
            }
        },
        status=status,
        dumps=_dumps,
    )


def _count_tokens(text: str) -> int:
    """Demo token count: whitespace-separated words, never less than 1."""
    return max(1, len(text.split()))


def _content_text(content: Any, index: int) -> str:
    """Text of a message's ``content``: a string, a list of parts (text parts are joined,
    images and the like ignored) or null (assistant tool calls)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            part["text"]
            for part in content
            if isinstance(part, dict) and part.get("type") == "text"
            and isinstance(part.get("text"), str)
        )
    raise _BadRequest(
        "content must be a string, a list of content parts or null", f"messages[{index}].content"
    )


@dataclass(frozen=True)
class _ChatRequest:
    model: str
    texts: list[tuple[str, str]]  # (role, text) per message, in order
    stream: bool
    include_usage: bool
    max_tokens: int | None


def _parse_chat_request(body: Any) -> _ChatRequest:
    """Validate the parts of a Chat Completions body this agent uses; raises ``_BadRequest``.
    ``temperature`` and other sampling knobs are accepted and ignored: replies are fixed."""
    if not isinstance(body, dict):
        raise _BadRequest("the request body must be a JSON object")
    messages = body.get("messages")
    if messages is None:
        raise _BadRequest("'messages' is a required property", "messages")
    if not isinstance(messages, list) or not messages:
        raise _BadRequest("'messages' must be a non-empty array", "messages")
    texts: list[tuple[str, str]] = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise _BadRequest(
                "each message must be an object with a string 'role'", f"messages[{index}]"
            )
        texts.append((message["role"], _content_text(message.get("content"), index)))
    model = body.get("model", CHAT_AGENT_ID)
    if not isinstance(model, str):
        raise _BadRequest("'model' must be a string", "model")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise _BadRequest("'stream' must be a boolean", "stream")
    temperature = body.get("temperature")
    if temperature is not None and (
        isinstance(temperature, bool) or not isinstance(temperature, int | float)
    ):
        raise _BadRequest("'temperature' must be a number", "temperature")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise _BadRequest("'stream_options' must be an object", "stream_options")
    # The newer name wins when both are sent, as in the OpenAI API.
    limit_param = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    max_tokens = body.get(limit_param)
    if max_tokens is not None and (
        isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1
    ):
        raise _BadRequest(f"'{limit_param}' must be a positive integer", limit_param)
    return _ChatRequest(
        model=model,
        texts=texts,
        stream=stream,
        include_usage=options.get("include_usage") is True,
        max_tokens=max_tokens,
    )


def _chat_reply(texts: list[tuple[str, str]]) -> str:
    """The deterministic answer: the last user message echoed behind a canned preface."""
    last_user = next((text.strip() for role, text in reversed(texts) if role == "user"), "")
    if not last_user:
        return f"Hello! Send me a message and I will echo it. {CHAT_SIGNATURE}"
    return f"You said: {last_user}. {CHAT_SIGNATURE}"


def _reply_pieces(reply: str, max_tokens: int | None) -> tuple[list[str], str]:
    """Split ``reply`` into one piece per word (each carrying its leading whitespace, so the
    pieces concatenate back exactly), cut to ``max_tokens``; also return the finish reason."""
    pieces = _WORD.findall(reply)
    if max_tokens is not None and len(pieces) > max_tokens:
        return pieces[:max_tokens], "length"
    return pieces, "stop"


def _parse_fail_after(request: web.Request) -> int | None:
    raw = request.headers.get(FAIL_AFTER_HEADER)
    if raw is None:
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        value = -1
    if value < 0:
        raise _BadRequest(f"{FAIL_AFTER_HEADER} must be a non-negative integer")
    return value


async def _chat_completions(request: web.Request) -> web.StreamResponse:
    """``POST /v1/chat/completions``: a ``chat.completion`` object, or with ``"stream": true``
    an SSE stream of ``chat.completion.chunk`` events (one word each, ``delta.role`` on the
    first), a ``finish_reason`` chunk, an optional usage chunk, then ``data: [DONE]``.

    Invalid input → 400 with an OpenAI-style ``{"error": {...}}`` body. With the header
    ``X-Demo-Fail-After: N`` a stream is cut after N events without a chunked terminator,
    as an agent dying mid-stream would (N beyond the event count: the stream completes)."""
    try:
        body = await _json_body(request)
    except ValueError:
        return _openai_error("the request body is not valid JSON")
    try:
        chat = _parse_chat_request(body)
        fail_after = _parse_fail_after(request) if chat.stream else None
    except _BadRequest as exc:
        return _openai_error(exc.message, exc.param)

    prompt_tokens = _count_tokens(" ".join(text for _, text in chat.texts))
    pieces, finish_reason = _reply_pieces(_chat_reply(chat.texts), chat.max_tokens)
    content = "".join(pieces)
    completion_tokens = max(1, len(pieces))
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    completion_id = f"chatcmpl-{uuid.uuid4().hex}"
    created = int(time.time())

    if not chat.stream:
        return web.json_response(
            {
                "id": completion_id,
                "object": "chat.completion",
                "created": created,
                "model": chat.model,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": content},
                        "finish_reason": finish_reason,
                    }
                ],
                "usage": usage,
            },
            dumps=_dumps,
        )

    def chunk(delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
        event: dict[str, Any] = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": chat.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
        if chat.include_usage:
            # OpenAI marks every non-final chunk with a null usage when usage was asked for.
            event["usage"] = None
        return event

    events: list[dict[str, Any] | str] = [
        chunk({"role": "assistant", "content": piece} if i == 0 else {"content": piece}, None)
        for i, piece in enumerate(pieces or [""])
    ]
    events.append(chunk({}, finish_reason))
    if chat.include_usage:
        events.append(
            {
                "id": completion_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": chat.model,
                "choices": [],
                "usage": usage,
            }
        )
    events.append("[DONE]")

    response = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream; charset=utf-8",
            "Cache-Control": "no-cache",
            # Reverse proxies must pass each event on at once, or streaming is invisible.
            "X-Accel-Buffering": "no",
        }
    )
    response.enable_chunked_encoding()
    await response.prepare(request)
    try:
        for sent, event in enumerate(events):
            if fail_after is not None and sent >= fail_after:
                _die(request)
                # aiohttp's write_eof then fails on the closing transport and is treated as
                # a client disconnect: no terminating chunk is sent, nothing is logged.
                return response
            if sent:
                # On shutdown the pauses end, so the caller still gets the whole answer
                # (it is fixed already) instead of waiting out a cut-off timer.
                await _pause(request.app)
            data = event if isinstance(event, str) else _dumps(event, separators=(",", ":"))
            await response.write(f"data: {data}\n\n".encode())
        await response.write_eof()
    except ConnectionError:
        # The caller went away mid-stream; nothing is left to tell it.
        pass
    return response


def _die(request: web.Request) -> None:
    """Close the connection under a half-sent chunked response. ``close`` (not ``abort``)
    flushes the events already written, so the client sees them and then a truncated body."""
    transport = request.transport
    if transport is not None:
        transport.close()


def _chat_app(chunk_delay: float) -> web.Application:
    app = _base_app(chunk_delay)
    app.router.add_post("/v1/chat/completions", _chat_completions)
    return app


# ------------------------------------------------------------------------- demo-translator

# Rows of the same phrase in each language; the first form is what a translation returns.
_PHRASES: tuple[dict[str, str], ...] = (
    {"en": "Hello", "zh": "你好", "ja": "こんにちは"},
    {"en": "Good morning", "zh": "早上好", "ja": "おはようございます"},
    {"en": "Good evening", "zh": "晚上好", "ja": "こんばんは"},
    {"en": "Good night", "zh": "晚安", "ja": "おやすみなさい"},
    {"en": "Thank you", "zh": "谢谢", "ja": "ありがとうございます"},
    {"en": "Goodbye", "zh": "再见", "ja": "さようなら"},
    {"en": "Sorry", "zh": "对不起", "ja": "ごめんなさい"},
    {"en": "How are you?", "zh": "你好吗？", "ja": "お元気ですか？"},
    {"en": "Nice to meet you", "zh": "很高兴认识你", "ja": "はじめまして"},
    {"en": "Welcome", "zh": "欢迎", "ja": "ようこそ"},
    {"en": "I love you", "zh": "我爱你", "ja": "愛しています"},
    {"en": "See you tomorrow", "zh": "明天见", "ja": "また明日"},
)
# Extra spellings that mean a row's phrase: (language, spelling, the row's English form).
_ALIASES: tuple[tuple[str, str, str], ...] = (
    ("en", "hi", "Hello"),
    ("en", "thanks", "Thank you"),
    ("en", "bye", "Goodbye"),
    ("zh", "您好", "Hello"),
    ("zh", "谢谢你", "Thank you"),
    ("zh", "早安", "Good morning"),
    ("ja", "ありがとう", "Thank you"),
    ("ja", "おはよう", "Good morning"),
)
_TRAILING = " \t\r\n.!?,;:。！？，、；：~～"


def _phrase_key(text: str) -> str:
    """Case, spacing and end punctuation do not change which phrase was meant."""
    return " ".join(text.casefold().split()).strip(_TRAILING)


def _build_phrasebook() -> dict[str, tuple[dict[str, str], str]]:
    book: dict[str, tuple[dict[str, str], str]] = {}
    for row in _PHRASES:
        for lang, phrase in row.items():
            book[_phrase_key(phrase)] = (row, lang)
    by_english = {row["en"]: row for row in _PHRASES}
    for lang, spelling, english in _ALIASES:
        book[_phrase_key(spelling)] = (by_english[english], lang)
    return book


_PHRASEBOOK = _build_phrasebook()
_KANA = re.compile(r"[\u3040-\u30ff]")
_HAN = re.compile(r"[\u4e00-\u9fff]")
_LATIN = re.compile(r"[A-Za-z]")


def _guess_language(text: str) -> str:
    """A script-based guess: kana → ja, Han without kana → zh, Latin letters → en,
    otherwise ``"und"`` (undetermined, as in BCP 47)."""
    if _KANA.search(text):
        return "ja"
    if _HAN.search(text):
        return "zh"
    if _LATIN.search(text):
        return "en"
    return "und"


def translate(text: str, target_lang: str) -> tuple[str, str]:
    """Translate ``text`` into ``target_lang``; return ``(translation, source_lang)``.

    Known phrases come from the built-in phrasebook; anything else is returned as
    ``"[<target_lang>] <text>"``, or unchanged when it already looks like the target
    language. This is a demo, and says so rather than pretending."""
    found = _PHRASEBOOK.get(_phrase_key(text))
    if found is not None:
        row, source = found
        return row[target_lang], source
    source = _guess_language(text)
    if source == target_lang:
        return text, source
    return f"[{target_lang}] {text}", source


def _envelope(code: int, message: str, data: dict[str, Any] | None = None) -> web.Response:
    # Business-envelope style: the HTTP status is 200 even for errors; ``code`` decides.
    return web.json_response({"code": code, "message": message, "data": data}, dumps=_dumps)


async def _translate(request: web.Request) -> web.Response:
    """``POST /translate`` ``{"text", "target_lang"}`` → HTTP 200 and the envelope
    ``{"code": 0, "message": "ok", "data": {"message", "source_lang"}}``.

    Errors, also HTTP 200: 40000 body not a JSON object, 40001 ``text`` missing or blank,
    40002 ``target_lang`` missing or not one of en / zh / ja."""
    try:
        body = await _json_body(request)
    except ValueError:
        body = None
    if not isinstance(body, dict):
        return _envelope(40000, "request body must be a JSON object")
    text = body.get("text")
    if not isinstance(text, str) or not text.strip():
        return _envelope(40001, "text is required")
    target_lang = body.get("target_lang")
    if target_lang not in LANGUAGES:
        return _envelope(40002, f"target_lang must be one of {', '.join(LANGUAGES)}")
    translation, source_lang = translate(text, target_lang)
    return _envelope(0, "ok", {"message": translation, "source_lang": source_lang})


def _translator_app(chunk_delay: float) -> web.Application:
    app = _base_app(chunk_delay)
    app.router.add_post("/translate", _translate)
    return app


# ------------------------------------------------------------------------------ lifecycle


def _endpoint(host: str, port: int) -> str:
    """The URL a client uses: wildcard binds are reached on loopback, IPv6 goes in []."""
    reach_host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host)  # noqa: S104
    if ":" in reach_host:
        reach_host = f"[{reach_host}]"
    return f"http://{reach_host}:{port}/"


async def start_demo_agents(
    host: str = "127.0.0.1", *, chunk_delay: float = 0.02
) -> tuple[list[DemoAgent], Callable[[], Awaitable[None]]]:
    """Start ``demo-chat`` and ``demo-translator`` on free ports of ``host`` (port 0) in the
    running event loop; both are listening when this returns.

    ``chunk_delay`` is the pause in seconds between streamed chat events. Returns the agents
    (chat first) and an idempotent async ``stop`` that closes both: streams in flight are
    finished without their pauses, and anything still running after about a second is cut.
    If either agent fails to start, neither is left running and the error propagates."""
    if chunk_delay < 0:
        raise ValueError("chunk_delay must be >= 0")
    specs: list[tuple[str, Callable[[float], web.Application], Callable[[str], dict[str, Any]]]] = [
        (CHAT_AGENT_ID, _chat_app, chat_descriptor),
        (TRANSLATOR_AGENT_ID, _translator_app, translator_descriptor),
    ]
    runners: list[web.AppRunner] = []
    agents: list[DemoAgent] = []
    try:
        for name, make_app, describe in specs:
            runner = web.AppRunner(
                make_app(chunk_delay), access_log=None, shutdown_timeout=_SHUTDOWN_TIMEOUT
            )
            await runner.setup()
            runners.append(runner)
            site = web.TCPSite(runner, host, 0)
            await site.start()
            port = int(runner.addresses[0][1])
            descriptor = describe(_endpoint(host, port))
            agents.append(DemoAgent(name=name, port=port, descriptor=descriptor))
    except BaseException:
        for runner in reversed(runners):
            await runner.cleanup()
        raise

    stopped = False

    async def stop() -> None:
        nonlocal stopped
        if stopped:
            return
        stopped = True
        # Concurrently, so one agent's slow client does not add to the other's wait.
        results = await asyncio.gather(
            *(runner.cleanup() for runner in runners), return_exceptions=True
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result

    return agents, stop


@dataclass
class _ThreadState:
    """What the agents' thread hands back to the thread that started it."""

    started: threading.Event = field(default_factory=threading.Event)
    agents: list[DemoAgent] = field(default_factory=list)
    loop: asyncio.AbstractEventLoop | None = None
    stopping: asyncio.Event | None = None
    error: BaseException | None = None


def run_in_thread(
    host: str = "127.0.0.1", *, chunk_delay: float = 0.02, start_timeout: float = 10.0
) -> tuple[list[DemoAgent], Callable[[], None]]:
    """Start both agents in a daemon thread with its own event loop, for synchronous callers
    such as a Django management command. Returns once both are listening.

    Returns the agents and an idempotent, blocking ``stop()`` that shuts them down and joins
    the thread. Start-up errors are re-raised here; ``TimeoutError`` if the agents are not
    up within ``start_timeout`` seconds."""
    state = _ThreadState()

    async def serve() -> None:
        try:
            agents, stop_agents = await start_demo_agents(host, chunk_delay=chunk_delay)
        except Exception as exc:
            state.error = exc
            state.started.set()
            return
        state.agents = agents
        state.loop = asyncio.get_running_loop()
        state.stopping = asyncio.Event()
        state.started.set()
        try:
            await state.stopping.wait()
        finally:
            await stop_agents()

    def main() -> None:
        try:
            asyncio.run(serve())
        except Exception as exc:
            # Never let it escape the thread: the caller learns of it from stop().
            state.error = exc
        finally:
            state.started.set()

    thread = threading.Thread(target=main, name="agent-reach-demo-agents", daemon=True)
    thread.start()
    if not state.started.wait(start_timeout):
        raise TimeoutError(f"demo agents did not start within {start_timeout}s")
    if state.error is not None:
        thread.join()
        raise state.error

    lock = threading.Lock()
    stopped = False

    def stop() -> None:
        nonlocal stopped
        with lock:
            if stopped:
                return
            stopped = True
        loop, stopping = state.loop, state.stopping
        if thread.is_alive() and loop is not None and stopping is not None:
            # RuntimeError: the loop closed in between, so the thread is finishing anyway.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stopping.set)
        thread.join()
        if state.error is not None:
            raise state.error

    return list(state.agents), stop
