"""The gateway's doors: each turns one kind of request into a ``Call`` for the pipeline.

- ``invoke``: ``POST /v1/invoke``, the platform's own contract (``AgentResponse``);
- ``chat_completions``: ``POST /v1/chat/completions``, OpenAI-compatible so the official
  SDK works: ``model`` names an agent (``name`` or ``namespace/name``) or a capability
  (``capability:<id>``), or the ``X-Reach-Intent`` header routes by intent;
- ``route``: ``GET /v1/route``, the dry run: ranked candidates, scores, drop reasons.

A door parses and shapes; it never forwards, retries, meters or admits itself.
"""

from __future__ import annotations

import re
import time
from dataclasses import replace
from urllib.parse import unquote

import orjson

from gateway.http_io import dumps_reply, parse_json, query_params
from gateway.pipeline import AsyncRequest, Call, Request, Result, route_message, suggested
from reach_core.errors import ReachError
from reach_core.numbers import rounded
from routing.router import RouteRequest, capability_visible, visible_to
from routing.table import RouteTable, name_key
from routing.text import holds_control, says_nothing

_ROUTE_FIELDS = ("capability", "intent", "min_version", "namespace", "cost")
_VERSION = re.compile(r"v?\d{1,9}(?:\.\d{1,9}){0,3}")
# A namespace's name as the registry keeps it (a slug of at most 63).
_NAMESPACE = re.compile(r"[-a-zA-Z0-9_]{1,63}")
MAX_INTENT_CHARS = 2000


# ---- POST /v1/invoke ------------------------------------------------------------------------


_ASYNC_FIELDS = ("mode", "callback_url", "callback_secret")


_INVOKE_FIELDS = frozenset((*_ROUTE_FIELDS, *_ASYNC_FIELDS, "input", "params", "stream",
                            "on_ambiguity"))


def invoke(request: Request, *, internal: bool) -> Call:
    body = parse_json(request.raw)
    # A misspelt field ("imput") would otherwise be a call without it.
    unknown = sorted(set(body) - _INVOKE_FIELDS)
    if unknown:
        raise ReachError("invalid_input", f"Unknown field(s): {', '.join(unknown)[:300]}.",
                         details={name[:100]: ["unknown field"] for name in unknown[:20]})
    mode = body.get("mode", "sync")
    if mode not in ("sync", "async"):
        raise ReachError("invalid_input", "'mode' must be 'sync' or 'async'.",
                         details={"mode": ["must be 'sync' or 'async'"]})
    namespace = request.header(b"x-reach-namespace")
    if mode == "sync":
        for name in ("callback_url", "callback_secret"):
            if name in body:
                raise ReachError("invalid_input", f"'{name}' is for \"mode\": \"async\" "
                                 "calls.", details={name: ["only with mode async"]})
        return invoke_call(body, request.key.tenant_pk, namespace=namespace,
                           internal=internal)
    if body.get("stream", False) is not False:
        raise ReachError("invalid_input", "An asynchronous call does not stream: follow "
                         "its task's events (/v1/tasks/<id>/events).",
                         details={"stream": ["not with mode async"]})
    callback_url = body.get("callback_url") or ""
    secret = body.get("callback_secret", "default")
    if not isinstance(secret, str) or not secret:
        raise ReachError("invalid_input", "'callback_secret' must name a signing secret.",
                         details={"callback_secret": ["must be a name"]})
    if "callback_secret" in body and not callback_url:
        raise ReachError("invalid_input", "'callback_secret' signs callbacks: it needs a "
                         "'callback_url'.", details={"callback_secret": ["needs callback_url"]})
    call_body = {k: v for k, v in body.items() if k not in _ASYNC_FIELDS}
    call = invoke_call(call_body, request.key.tenant_pk, namespace=namespace,
                       internal=internal)
    return replace(call, asynchronous=AsyncRequest(
        request={"body": call_body, "namespace": namespace, "internal": internal},
        callback_url=callback_url, signing_secret=secret))


def invoke_call(body: dict, tenant_pk: int, *, namespace: str | None, internal: bool,
                prefer_instance: int | None = None) -> Call:
    """The call ``POST /v1/invoke`` makes of ``body``: what a task's attempts run again."""
    stream = _stream_flag(body)
    payload, params = body.get("input", {}), body.get("params", {})
    if not isinstance(payload, dict) or not isinstance(params, dict):
        raise ReachError("invalid_input", "'input' and 'params' must be JSON objects.")
    payload = {**params, **payload}
    route = route_request(
        tenant_pk,
        {k: body.get(k) for k in _ROUTE_FIELDS} | {
            "src_lang": payload.get("src_lang"), "dest_lang": payload.get("dest_lang"),
            "input_chars": str(len(orjson.dumps(payload))),
        },
        namespace=namespace, internal=internal,
    )
    if prefer_instance is not None:
        route = replace(route, prefer_instance=prefer_instance)
    on_ambiguity = body.get("on_ambiguity", "guess")
    if on_ambiguity not in ("guess", "ask"):
        raise ReachError("invalid_input", "'on_ambiguity' must be 'guess' or 'ask'.",
                         details={"on_ambiguity": ["must be 'guess' or 'ask'"]})
    return Call(route=route, payload=lambda protocol: payload, reply=agent_response,
                stream=stream, events=agent_response_event, on_ambiguity=on_ambiguity)


def agent_response_event(result: Result) -> bytes:
    """A non-streaming agent's whole answer, as the one event of a stream."""
    return b"data: " + dumps_reply(agent_response(result)) + b"\n\n"


def agent_response(result: Result) -> dict:
    candidate, reply, ctx = result.candidate, result.reply, result.ctx
    total_ms = (time.monotonic() - ctx.started) * 1000
    plan = {"plan": list(ctx.plan)} if ctx.plan else {}
    return {
        "request_id": ctx.request_id,
        "agent": candidate.agent.name,
        "instance": candidate.instance.pk,
        "capability": candidate.capability.capability_id,
        "reply_content": reply.reply_content,
        "tool_calls": reply.tool_calls,
        "output": reply.output,
        "raw_meta": reply.raw_meta,
        "usage": {"input_tokens": reply.input_tokens, "output_tokens": reply.output_tokens,
                  "cost": result.cost()},
        "timings": {"route_ms": rounded(result.route_ms, 3),
                    "upstream_ms": rounded(total_ms - result.route_ms, 3),
                    "total_ms": rounded(total_ms, 3)},
        # An intent: how sure its routing was (as a dry run says). Of several steps: this
        # call ran the first; the caller runs the rest.
        **(ctx.sureness or {}),
        **plan,
    }


# ---- POST /v1/chat/completions --------------------------------------------------------------


def chat_completions(request: Request, *, internal: bool) -> Call:
    body = parse_json(request.raw)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ReachError("invalid_input", "'messages' must be a non-empty list.")
    stream = _stream_flag(body)
    route = _chat_route(request.table, request.key.tenant_pk, body.get("model"),
                        intent_header(request),
                        request.header(b"x-reach-namespace"), internal)
    wants_usage = bool((body.get("stream_options") or {}).get("include_usage")) \
        if isinstance(body.get("stream_options"), dict) else False
    chunk_id = f"chatcmpl-{request.request_id}"
    return Call(
        route=route, payload=lambda protocol: protocol.chat_input(body),
        reply=completion, stream=stream,
        events=completion_events_with_usage if wants_usage else completion_events,
        # Another protocol's stream (A2A events) goes out as chat chunks, event by event.
        reframe=lambda protocol, model: None if protocol.speaks_chat
        else lambda text: _chunk(chunk_id, model, {"content": text}, None),
        finish=_chunk(chunk_id, "", {}, "stop") + b"data: [DONE]\n\n",
        keep_usage_events=wants_usage,
        usage_event=(lambda tokens_in, tokens_out: _usage_chunk(chunk_id, tokens_in,
                                                                tokens_out))
        if wants_usage else None,
    )


def intent_header(request: Request) -> str | None:
    """``X-Reach-Intent``: UTF-8, raw or percent-encoded (HTTP headers are bytes, and a
    Chinese intent arrives as its UTF-8 bytes from most clients, percent-encoded from
    those that keep headers ASCII)."""
    raw = request.header(b"x-reach-intent")
    if raw is None:
        return None
    try:
        text = raw.encode("latin-1").decode("utf-8")
        text = unquote(text, errors="strict") if "%" in text else text
    except UnicodeDecodeError:
        raise ReachError("invalid_input", "X-Reach-Intent must be UTF-8, raw or "
                         "percent-encoded.", details={"X-Reach-Intent": ["not UTF-8"]}
                         ) from None
    return checked_intent(text, "X-Reach-Intent")


def checked_intent(intent: str, name: str) -> str:
    """``intent`` (named ``name`` in errors) when it can be matched; else a 400. The same
    rules on every door: a break test sent through the chat door's header the 15,000
    characters the body's field refused, and held every tenant's calls for 1.5 s."""
    if says_nothing(intent):
        raise ReachError("invalid_input", f"'{name}' must say what is wanted: not only "
                         "spaces or invisible characters.", details={name: ["empty"]})
    if holds_control(intent):
        raise ReachError("invalid_input", f"'{name}' holds a control character (a NUL, "
                         "an escape...): send text only; tabs and line breaks are fine.",
                         details={name: ["holds a control character"]})
    if len(intent) > MAX_INTENT_CHARS:
        # Matching costs in proportion to the text: a long one would hold the event loop
        # (a break test: 750 KB intents held every other call for seconds).
        raise ReachError("invalid_input", f"'{name}' is at most {MAX_INTENT_CHARS} "
                         "characters: say what is wanted; the material goes in 'input'.",
                         details={name: ["too long"]})
    return intent


def _chunk(chunk_id: str, model: str, delta: dict, finish_reason: str | None) -> bytes:
    return b"data: " + orjson.dumps({
        "id": chunk_id, "object": "chat.completion.chunk", "created": int(time.time()),
        "model": model, "choices": [{"index": 0, "delta": delta,
                                  "finish_reason": finish_reason}]}) + b"\n\n"


def _usage_chunk(chunk_id: str, tokens_in: int, tokens_out: int) -> bytes:
    """The chunk ``stream_options.include_usage`` asks for: no choices, the usage."""
    return b"data: " + orjson.dumps({
        "id": chunk_id, "object": "chat.completion.chunk", "created": int(time.time()),
        "model": "", "choices": [], "usage": {
            "prompt_tokens": tokens_in, "completion_tokens": tokens_out,
            "total_tokens": tokens_in + tokens_out}}) + b"\n\n"


def namespace_of(header: str | None, given: str | None) -> str:
    """The namespace a call names, by the ``X-Reach-Namespace`` header or the body's (or
    query's) ``namespace``; "default" when neither is given. One that cannot name one
    (empty, 5,000 characters, "../../etc": taken and answered with a 404 about the
    capability, a re-test) or two that disagree (the header won silently) are a 400."""
    if header is not None and given is not None and header != given:
        raise ReachError("invalid_input", "X-Reach-Namespace and 'namespace' name different "
                         "namespaces: give one.", details={"namespace": ["given twice"]})
    namespace = header if header is not None else given
    if namespace is None:
        return "default"
    if not _NAMESPACE.fullmatch(namespace):
        raise ReachError("invalid_input", "The namespace (X-Reach-Namespace or 'namespace') "
                         "is a name of letters, digits, '-' and '_', at most 63 characters.",
                         details={"namespace": ["not a namespace name"]})
    return namespace


def _chat_route(table: RouteTable, tenant_pk: int, model, intent: str | None,
                namespace: str | None,
                internal: bool) -> RouteRequest:
    base = {"tenant_pk": tenant_pk, "namespace": namespace_of(namespace, None),
            "internal_network": internal}
    if intent:
        return RouteRequest(intent=intent, **base)
    if not isinstance(model, str) or not model:
        raise ReachError("invalid_input", "'model' must name an agent or 'capability:<id>' "
                         "(or send the X-Reach-Intent header).")
    if model.startswith("capability:"):
        return RouteRequest(capability=model.split(":", 1)[1], **base)
    for pk in table.agents_by_name.get(name_key(model), ()):
        agent = table.agents[pk]
        # Another tenant's private agent is answered exactly like one that does not exist.
        if agent.capabilities and visible_to(table, tenant_pk, agent, agent.capabilities[0]):
            named = f"{agent.namespace}/{agent.name}" if "/" in model else agent.name
            return RouteRequest(capability=agent.capabilities[0].capability_id, agent=named,
                                **base)
    raise ReachError("no_capability", f"No agent is named {model!r}.")


def completion(result: Result) -> dict:
    reply = result.reply
    content = reply.reply_content
    if content is None and not reply.tool_calls and reply.output is not None:
        # A plain agent with no text to say: its output is the answer, as JSON text.
        content = reply.output if isinstance(reply.output, str) \
            else dumps_reply(reply.output).decode()
    message = {"role": "assistant", "content": content}
    if reply.tool_calls:
        message["tool_calls"] = reply.tool_calls
    return {
        "id": f"chatcmpl-{result.ctx.request_id}", "object": "chat.completion",
        "created": int(time.time()), "model": result.candidate.agent.name,
        "choices": [{"index": 0, "message": message,
                     "finish_reason": reply.raw_meta.get("finish_reason") or "stop"}],
        "usage": {"prompt_tokens": reply.input_tokens,
                  "completion_tokens": reply.output_tokens,
                  "total_tokens": reply.input_tokens + reply.output_tokens},
    }


def completion_events_with_usage(result: Result) -> bytes:
    return completion_events(result, usage=True)


def completion_events(result: Result, *, usage: bool = False) -> bytes:
    """A whole answer as a chat stream: one content chunk, the final chunk, the usage
    chunk when asked for (``stream_options.include_usage``), ``[DONE]``."""
    whole = completion(result)
    base = {"id": whole["id"], "object": "chat.completion.chunk",
            "created": whole["created"], "model": whole["model"]}
    events = [
        {**base, "choices": [{"index": 0, "delta": {"role": "assistant",
                                                    "content": whole["choices"][0]
                                                    ["message"]["content"] or ""},
                              "finish_reason": None}]},
        {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    ]
    if usage:
        events.append({**base, "choices": [], "usage": whole["usage"]})
    return b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events) \
        + b"data: [DONE]\n\n"


# ---- GET /v1/route --------------------------------------------------------------------------


DRY_RUN_PARAMS = frozenset({"capability", "intent", "min_version", "src_lang", "dest_lang",
                            "format", "input_chars", "cost", "namespace"})


async def dry_run(decide, request: Request, *, internal: bool) -> dict:
    """Ranked candidates with every score component and each drop reason; calls nobody.
    ``decide(table, route, pick=False)`` is the pipeline's (an intent's matching is
    charged to its tenant's CPU share)."""
    table = request.table
    query = query_params(request.scope)
    unknown = sorted(set(query) - DRY_RUN_PARAMS)
    if unknown:
        # A misspelt parameter ("min_verison") would be a dry run of another question.
        raise ReachError("invalid_input", f"Unknown query parameter(s): "
                         f"{', '.join(repr(n[:40]) for n in unknown[:5])}; known here: "
                         f"{', '.join(sorted(DRY_RUN_PARAMS))}.",
                         details={n[:100]: ["is not a parameter of /v1/route"]
                                  for n in unknown[:20]})
    route = route_request(request.key.tenant_pk, query,
                          namespace=request.header(b"x-reach-namespace"), internal=internal)
    decision = await decide(table, route, pick=False)
    explained = {"table_version": table.version, **decision.explain()}
    # The intent index covers every tenant's capabilities: name only those the caller
    # may see (its own, granted or public), in the matches, the plan and the answer.
    def visible(capability_id: str | None) -> bool:
        return bool(capability_id) and (capability_id == route.capability or
                                        capability_visible(table, route.tenant_pk,
                                                           capability_id))
    if "matches" in explained:
        explained["matches"] = [m for m in explained["matches"] if visible(m["capability"])]
    if "suggestions" in explained:
        explained["suggestions"] = [m for m in explained["suggestions"]
                                    if visible(m["capability"])]
    if "plan" in explained:
        explained["plan"] = [c for c in explained["plan"] if visible(c)]
    if not visible(explained.get("capability")):
        explained["capability"] = None
    if decision.error:
        raise ReachError(decision.error, route_message(decision, table, route),
                         details=suggested(decision, table, route), explain=explained)
    return {"request_id": request.request_id, **explained}


# ---- shared ---------------------------------------------------------------------------------


def _stream_flag(body: dict) -> bool:
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ReachError("invalid_input", "'stream' must be true or false.")
    return stream


def route_request(tenant_pk: int, params: dict, *, namespace: str | None,
                  internal: bool = False) -> RouteRequest:
    capability, intent = params.get("capability"), params.get("intent")
    for name, value in (("capability", capability), ("intent", intent)):
        if value == "":
            raise ReachError("invalid_input", f"'{name}' is empty: give the capability id "
                             "or say what you want.", details={name: ["is empty"]})
    if bool(capability) == bool(intent):
        raise ReachError("invalid_input", "Give exactly one of 'capability' or 'intent'.")
    if not isinstance(capability or intent, str):
        raise ReachError("invalid_input", "'capability' and 'intent' must be strings.")
    if isinstance(intent, str):
        checked_intent(intent, "intent")
    input_chars = params.get("input_chars")
    if input_chars is not None and not str(input_chars).isdigit():
        raise ReachError("invalid_input", "'input_chars' must be a non-negative integer.")
    cost_preference = params.get("cost") or "best"
    if cost_preference not in ("best", "cheapest"):
        raise ReachError("invalid_input", "'cost' must be 'best' or 'cheapest'.")
    for name in ("min_version", "src_lang", "dest_lang", "format", "namespace"):
        if params.get(name) is not None and not isinstance(params.get(name), str):
            raise ReachError("invalid_input", f"'{name}' must be a string.")
    min_version = params.get("min_version")
    if min_version is not None and not _VERSION.fullmatch(min_version):
        # Read leniently it would be 0.0.0 and match every version.
        raise ReachError("invalid_input", "'min_version' is a version such as '1.2' or "
                         "'1.2.0'.", details={"min_version": ["not a version"]})
    return RouteRequest(
        tenant_pk=tenant_pk, capability=capability, intent=intent,
        namespace=namespace_of(namespace, params.get("namespace")),
        min_version=params.get("min_version"), src_lang=params.get("src_lang"),
        dest_lang=params.get("dest_lang"), input_format=params.get("format"),
        input_chars=int(input_chars) if input_chars is not None else None,
        cost_preference=cost_preference, internal_network=internal,
    )


# ---- GET /v1/models ------------------------------------------------------------------------


def models(table: RouteTable, tenant_pk: int, *, internal: bool) -> list[dict]:
    """What ``model`` may name for this tenant, in the OpenAI shape: each agent it may
    reach (by name, or ``namespace/name`` when the name is taken in several namespaces),
    then ``capability:<id>`` for each capability it may reach. Sorted by id."""
    out: dict[str, dict] = {}
    for agent in table.agents.values():
        reachable = [c for c in agent.capabilities if visible_to(table, tenant_pk, agent, c)]
        if not reachable or (agent.internal_only and not internal):
            continue
        shared = len(table.agents_by_name.get(name_key(agent.name), ())) > 1
        name = f"{agent.namespace}/{agent.name}" if shared else agent.name
        owner = table.tenants.get(agent.owner_tenant_pk)
        out[name] = _model(name, owner.slug if owner else "agent-reach",
                           f"agent {agent.namespace}/{agent.name} v{agent.version}")
        for capability in reachable:
            ident = f"capability:{capability.capability_id}"
            out.setdefault(ident, _model(ident, "agent-reach",
                                         capability.description or capability.capability_id))
    return [out[k] for k in sorted(out)]


def _model(ident: str, owner: str, description: str) -> dict:
    # "created" is required by the OpenAI shape; the table does not know when a row was
    # made, so every entry says 0 (the epoch) rather than invent a date.
    return {"id": ident, "object": "model", "created": 0, "owned_by": owner,
            "description": description[:300]}
