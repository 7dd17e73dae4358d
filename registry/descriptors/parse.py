"""Parse the three descriptor formats into one ``AgentSpec``.

Each parser validates against its JSON Schema, then runs the cross-field checks,
and raises one ``DescriptorError`` holding every problem found. Problems are
keyed by where they sit in the document the author wrote (``capabilities[2].timeout_ms``,
``skills[0].x-reach.input_schema``; ``$`` is the document itself).
"""

from __future__ import annotations

import copy
import math
import re
import unicodedata
from collections.abc import Iterable
from typing import Any, get_type_hints

import yaml
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, ValidationError
from rest_framework.exceptions import ParseError

from reach_core.schemas import schema_problems
from reach_platform.parsers import MAX_DEPTH, check_document
from registry.descriptors import schemas
from registry.descriptors.flat import as_json_schema
from registry.spec import AgentSpec, CapabilitySpec, CredentialSpec, DescriptorError

Problems = dict[str, list[str]]
# A capability on its way to a CapabilitySpec: the path its id is reported at,
# CapabilitySpec keyword arguments still as the author wrote them (None = not
# given), and its embedded JSON Schemas keyed by the path to report them at.
_RawCapability = tuple[str, dict[str, Any], dict[str, Any]]

_DEFAULTS = AgentSpec(name="")
_TYPE_WORDS = {
    "object": "an object",
    "array": "a list",
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "null": "null",
}
_NOT_IN_ID = re.compile(r"[^a-z0-9_.\-]+")


def _int_fields(spec: type) -> tuple[str, ...]:
    """The fields of ``spec`` declared ``int`` or ``int | None``."""
    return tuple(n for n, hint in get_type_hints(spec).items() if hint in (int, int | None))


# JSON Schema counts 8.0 as an integer; the spec wants real ints in these.
_AGENT_INTS = _int_fields(AgentSpec)
_CAPABILITY_INTS = _int_fields(CapabilitySpec)


def parse_json_descriptor(data: object) -> AgentSpec:
    """Parse a JSON descriptor (already decoded) into an ``AgentSpec``.

    ``agent_id`` wins over ``name``; a capability's ``id`` wins over ``type``;
    ``params`` becomes ``input_schema`` only when no ``input_schema`` is given.
    ``reach.use_tls`` turns an ``http://`` endpoint into ``https://``.
    Raises ``DescriptorError`` listing every problem.
    """
    problems = _schema_problems(schemas.JSON_DESCRIPTOR_SCHEMA, data)
    if not isinstance(data, dict):
        raise DescriptorError(problems)
    caps = [_json_capability(f"capabilities[{i}]", c, problems)
            for i, c in _dicts(data.get("capabilities"))]
    reach = _obj(data.get("reach"))
    endpoint = reach.get("endpoint")
    if reach.get("use_tls") is True and isinstance(endpoint, str):
        endpoint = _with_tls(endpoint)
    ttl, interval = _liveness(data.get("liveness"), problems)
    agent = {
        "name": data.get("agent_id", data.get("name")),
        "version": data.get("version"),
        "description": data.get("description"),
        "namespace": data.get("namespace"),
        "team": data.get("team"),
        **_reached(reach, "reach", problems),
        "endpoint": endpoint,
        "reach_mode": reach.get("mode"),
        "instance_key": reach.get("instance"),
        "weight": reach.get("weight"),
        "priority": reach.get("priority"),
        "lease_ttl_seconds": ttl,
        "heartbeat_interval_seconds": interval,
        "source_format": "json",
    }
    return _finish(agent, caps, problems, data)


def parse_agent_entry(data: object) -> AgentSpec:
    """Parse an operator's agent entry: one item of an ``agents:`` list, or the list
    holding exactly one. The field-report form: top-level ``endpoint``, ``protocol``
    (``openai-compatible``, ``raw-http`` …), ``capabilities`` as ids or objects,
    ``internal_only``, ``auth``, ``pool`` and ``routing``. Raises ``DescriptorError``.
    """
    at = ""
    if isinstance(data, dict) and "agents" in data:
        entries = data.get("agents")
        if set(data) != {"agents"}:
            extra = sorted(set(data) - {"agents"})
            raise DescriptorError({k: ["is not a known field (beside agents)"] for k in extra})
        if not isinstance(entries, list) or len(entries) != 1:
            raise DescriptorError({"agents": ["must list exactly one agent per registration"]})
        data, at = entries[0], "agents[0]"
    problems = _prefixed(_schema_problems(schemas.AGENT_ENTRY_SCHEMA, data), at)
    if not isinstance(data, dict):
        raise DescriptorError(problems)
    prefix = f"{at}." if at else ""
    caps = []
    for i, c in enumerate(data.get("capabilities") or ()):
        if isinstance(c, str):
            caps.append((f"{prefix}capabilities[{i}]", {"capability_id": c}, {}))
        elif isinstance(c, dict):
            caps.append(_json_capability(f"{prefix}capabilities[{i}]", c, problems))
    ttl, interval = _liveness(data.get("liveness"), problems, f"{prefix}liveness")
    routing = _obj(data.get("routing"))
    agent = {
        "name": data.get("name"),
        "version": data.get("version"),
        "description": data.get("description"),
        "namespace": data.get("namespace"),
        "team": data.get("team"),
        **_reached(data, at, problems),
        "endpoint": data.get("endpoint"),
        "weight": routing.get("weight"),
        "priority": routing.get("priority"),
        "lease_ttl_seconds": ttl,
        "heartbeat_interval_seconds": interval,
        "source_format": "entry",
    }
    return _finish(agent, caps, problems, data)


def parse_capability_yaml(text: str) -> AgentSpec:
    """Parse ``capability.yaml`` text into an ``AgentSpec``.

    The text is untrusted: a safe loader without aliases or repeated keys reads it. The top-level
    ``language`` is put first in every capability's languages. Each capability's
    first endpoint gives its path, and its protocol is the agent's, so all
    capabilities must agree on it. Raises ``DescriptorError``; a syntax
    error is reported at ``$`` with its line and column.
    """
    if not isinstance(text, str):
        raise DescriptorError({"$": ["must be YAML text"]})
    try:
        data = yaml.load(text, Loader=_UntrustedLoader)  # noqa: S506 (safe: see the class)
    except yaml.YAMLError as exc:
        raise DescriptorError({"$": [f"not valid YAML: {_yaml_reason(exc)}"]}) from None
    except RecursionError:
        raise DescriptorError({"$": ["not valid YAML: nested too deeply"]}) from None
    try:
        problems = check_document(data)
    except ParseError:
        raise DescriptorError({"$": ["nested more than "
                                     f"{MAX_DEPTH} levels deep"]}) from None
    if problems:
        raise DescriptorError(problems)
    if isinstance(data, dict) and ("agents" in data or "protocol" in data):
        return parse_agent_entry(data)
    problems = _schema_problems(schemas.CAPABILITY_YAML_SCHEMA, data)
    if not isinstance(data, dict):
        raise DescriptorError(problems)
    language = data.get("language")
    if not (isinstance(language, str) and _natural_language(language)):
        language = None  # what the agent is written in: kept with the document only
    protocol: str | None = None
    caps: list[_RawCapability] = []
    for i, c in _dicts(data.get("capabilities")):
        at = f"capabilities[{i}]"
        endpoints = c.get("endpoints")
        first = _obj(endpoints[0]) if isinstance(endpoints, list) and endpoints else {}
        fields = {
            "capability_id": c.get("id"),
            **_described(c),
            **_reach_fields(c),
            "kind": c.get("type"),
            "path": first.get("path"),
        }
        _flatten_schemas(at, fields, problems)
        languages = fields["languages"]
        if isinstance(language, str) and isinstance(languages or [], list):
            fields["languages"] = [language, *(languages or [])]
        caps.append((f"{at}.id", fields, _schema_checks(at, fields)))
        found = first.get("protocol")
        if isinstance(found, str) and protocol is None:
            protocol = found
        elif isinstance(found, str) and found != protocol:
            # AgentSpec has one protocol; guessing which endpoint is right would misroute.
            _add(problems, f"{at}.endpoints[0].protocol", f"must match the others ({protocol})")
    ttl, interval = _liveness(data.get("liveness"), problems)
    agent = {
        "name": data.get("name"),
        "version": data.get("version"),
        "description": data.get("description"),
        "protocol": protocol,
        "namespace": data.get("namespace"),
        "team": _obj(data.get("metadata")).get("owner_team"),
        "endpoint": data.get("endpoint"),
        "reach_mode": _obj(data.get("reach")).get("mode"),
        "instance_key": _obj(data.get("reach")).get("instance"),
        "lease_ttl_seconds": ttl,
        "heartbeat_interval_seconds": interval,
        "source_format": "yaml",
    }
    return _finish(agent, caps, problems, data)


class _UntrustedLoader(yaml.SafeLoader):
    """``SafeLoader`` without aliases and without repeated keys.

    An alias re-uses a node, so nine nested anchors of ten references each expand ~600
    bytes into a billion values (the "billion laughs"); descriptors never need them. A
    repeated key would silently keep the last value, which JSON bodies refuse too.
    """

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            raise yaml.constructor.ConstructorError(
                None, None, "aliases (*name) are not accepted in a descriptor", mark)
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):
        seen: set = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, str | int | float | bool) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"the key {key!r} is given twice", key_node.start_mark)
            seen.add(key) if isinstance(key, str | int | float | bool) else None
        return super().construct_mapping(node, deep=deep)


def parse_agent_card(card: object) -> AgentSpec:
    """Parse an A2A Agent Card (already decoded) into an ``AgentSpec``.

    Skills become capabilities. Skill ids and the card name are free text, so
    they are folded into the id/name patterns (lower-case, runs of other
    characters become '-'). A skill's ``x-reach`` object carries what a card
    cannot: schemas, timeout, rate limit, languages, direction, kind, path.
    Kind otherwise follows ``capabilities.streaming``. Raises ``DescriptorError``.
    """
    problems = _schema_problems(schemas.AGENT_CARD_SCHEMA, card)
    if not isinstance(card, dict):
        raise DescriptorError(problems)
    streaming = _obj(card.get("capabilities")).get("streaming") is True
    caps: list[_RawCapability] = []
    for i, skill in _dicts(card.get("skills")):
        at = f"skills[{i}]"
        extension = _obj(skill.get("x-reach"))
        fields = {
            "capability_id": _folded(skill.get("id"), 128, f"{at}.id", problems),
            "display_name": skill.get("name"),
            "description": skill.get("description"),
            "keywords": skill.get("tags"),
            "examples": skill.get("examples"),
            "not_for": extension.get("not_for"),
            **_reach_fields(extension),
            "kind": extension.get("kind", "stream" if streaming else "sync"),
            "path": extension.get("path"),
        }
        _flatten_schemas(f"{at}.x-reach", fields, problems)
        caps.append((f"{at}.id", fields, _schema_checks(f"{at}.x-reach", fields)))
    agent = {
        "name": _folded(card.get("name"), 100, "name", problems),
        "version": card.get("version"),
        "description": card.get("description"),
        "protocol": "a2a",
        "team": _obj(card.get("provider")).get("organization"),
        "endpoint": card.get("url"),
        "source_format": "a2a",
    }
    return _finish(agent, caps, problems, card)


def detect_and_parse(body: object) -> AgentSpec:
    """Parse ``body`` in whichever format it is.

    Text is ``capability.yaml`` (or an operator's entry written in YAML); a mapping
    with ``skills`` is an Agent Card; one with ``agents`` or a top-level ``endpoint``
    or ``protocol`` is an operator's entry; anything else is treated as a JSON
    descriptor (so a non-mapping is reported as ``$: must be an object``).
    """
    if isinstance(body, str):
        return parse_capability_yaml(body)
    if isinstance(body, dict) and "skills" in body:
        return parse_agent_card(body)
    if isinstance(body, dict) and ("agents" in body or "endpoint" in body
                                   or "protocol" in body):
        return parse_agent_entry(body)
    return parse_json_descriptor(body)


# -- validation ---------------------------------------------------------------


def _schema_problems(schema: dict[str, Any], data: object) -> Problems:
    """Every JSON Schema violation in ``data``, as path -> short messages."""
    problems: Problems = {}
    for error in Draft202012Validator(schema).iter_errors(data):
        for path, message in _describe(error):
            _add(problems, path, message)
    return problems


def _describe(error: ValidationError) -> list[tuple[str, str]]:
    """Turn one jsonschema error into (path, message) pairs an author can act on."""
    where = list(error.absolute_path)
    keyword, value, schema = error.validator, error.validator_value, error.schema
    if keyword == "additionalProperties" and value is False:
        # Each unknown key at its own path, with what would have been understood.
        known = ", ".join(schema.get("properties", {}))
        return [(_path([*where, key]), _SECRET_HINT if key.lower() in _SECRET_WORDS
                 and "value_env" in known else f"is not a known field (known here: {known})")
                for key in error.instance if key not in schema.get("properties", {})]
    if keyword == "enum" and where and where[-1] == "protocol" and error.instance == "grpc":
        return [(_path(where), "grpc is not supported: the gateway speaks http (raw-http), "
                               "openai (openai-compatible) and a2a")]
    if keyword == "enum" and where and where[-1] == "method":
        return [(_path(where), "must be POST: the gateway always POSTs to a capability's "
                               "path (gRPC method names are not supported)")]
    if keyword == "required":
        # Reported at the missing field itself: that is where the author must add it.
        return [(_path([*where, p]), "is required") for p in value if p not in error.instance]
    if keyword == "anyOf" and all(_lone_required(s) for s in value):
        first, *others = (s["required"][0] for s in value)
        return [(_path([*where, first]), f"is required (or {' or '.join(others)})")]
    positive = schema.get("type") == "integer" and schema.get("minimum") == 1
    if keyword in ("type", "minimum") and positive:
        message = "must be a positive integer"
    elif keyword == "type":
        types = [value] if isinstance(value, str) else value
        message = "must be " + " or ".join(_TYPE_WORDS.get(t, t) for t in types)
    elif keyword == "enum":
        message = "must be one of: " + ", ".join(map(str, value))
    elif keyword == "pattern":
        message = schemas.PATTERN_HINTS.get(value, f"must match {value}")
    elif keyword == "maximum":
        message = f"must be at most {value}"
    elif keyword in ("minItems", "minLength") and value == 1:
        message = "must not be empty"
    elif keyword == "maxLength":
        message = f"must be at most {value} characters"
    elif keyword == "maxItems":
        message = f"must have at most {value} item{'s' if value != 1 else ''}"
    elif keyword in ("anyOf", "oneOf", "if", "then", "else"):
        message = "is not one of the accepted forms here"
    else:
        # Never ``error.message``: it quotes the value, which may be a secret pasted
        # into the wrong place.
        message = f"does not satisfy {keyword} {value!r}" if not isinstance(
            value, dict | list) else f"does not satisfy {keyword}"
    return [(_path(where), message)]


_SECRET_WORDS = frozenset({"value", "token", "secret", "password", "api_key", "apikey"})
# A message, not a secret (S105 reads the name).
_SECRET_HINT = (
    "secrets are not accepted in a descriptor: put it in an environment variable "  # noqa: S105
    "of the gateway and name that variable in value_env"
)


def _lone_required(schema: object) -> bool:
    """Whether ``schema`` is ``{"required": [one_name]}``, an alternative of "x or y"."""
    return (
        isinstance(schema, dict) and list(schema) == ["required"] and len(schema["required"]) == 1
    )


def _finish(agent: dict[str, Any], caps: list[_RawCapability], problems: Problems,
            document: dict[str, Any]) -> AgentSpec:
    """Run the cross-capability checks, then build the spec if nothing is wrong."""
    if agent.get("reach_mode") == "tunnel":
        if not agent.get("instance_key"):
            _add(problems, "reach.instance", "a tunnelled agent names its instance key")
        agent["endpoint"] = None  # reached through the tunnel, whatever else is said
    seen: dict[str, str] = {}
    for id_path, fields, checks in caps:
        cap_id = fields["capability_id"]
        if isinstance(cap_id, str) and cap_id in seen:
            _add(problems, id_path, f"duplicate capability id {cap_id!r} (first at {seen[cap_id]})")
        elif isinstance(cap_id, str):
            seen[cap_id] = id_path
        for path, schema in checks.items():
            if isinstance(schema, dict):
                _check_json_schema(path, schema, problems)
    if problems:
        raise DescriptorError(problems)
    agent["capabilities"] = tuple(_capability(fields) for _, fields, _ in caps)
    agent["protocol"] = schemas.PROTOCOL_ALIASES.get(agent.get("protocol"),
                                                     agent.get("protocol"))
    agent["document"] = copy.deepcopy(document)
    agent |= {key: _text(agent.get(key)) for key in ("description", "team")}
    agent |= {key: _int(agent.get(key)) for key in _AGENT_INTS if key in agent}
    return AgentSpec(**_given(agent))


def _check_json_schema(path: str, schema: dict[str, Any], problems: Problems) -> None:
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        inner = f" (at {_path(exc.absolute_path)})" if exc.absolute_path else ""
        _add(problems, path, f"not a valid JSON Schema: {exc.message}{inner}")
        return
    # Followed only within itself, patterns the gateway's engine compiles.
    for problem in schema_problems(schema):
        _add(problems, path, problem)


def _liveness(raw: object, problems: Problems,
              at: str = "liveness") -> tuple[int | None, int | None]:
    """Lease TTL and heartbeat interval; the TTL defaults to cover three intervals.

    A TTL of at least three intervals lets an instance miss two heartbeats before its lease
    lapses, so one slow beat does not flap it out of routing.
    """
    liveness = _obj(raw)
    ttl, interval = liveness.get("ttl_seconds"), liveness.get("heartbeat_interval_seconds")
    effective = interval if interval is not None else _DEFAULTS.heartbeat_interval_seconds
    if not _is_int(effective):
        return ttl, interval
    if ttl is None:
        ttl = max(_DEFAULTS.lease_ttl_seconds, 3 * effective)
    elif _is_int(ttl) and ttl < 3 * effective:
        _add(
            problems,
            f"{at}.ttl_seconds",
            # Spelled by name: ruff (RUF001) flags the literal sign as a look-alike of 'x'.
            f"must be at least 3 \N{MULTIPLICATION SIGN} heartbeat_interval_seconds "
            f"({3 * effective}) so two missed heartbeats do not expire the lease",
        )
    return ttl, interval


# -- building -----------------------------------------------------------------


def _json_capability(at: str, c: dict[str, Any], problems: Problems) -> _RawCapability:
    fields = {"capability_id": c.get("id", c.get("type")), **_described(c), **_reach_fields(c)}
    fields |= {"kind": c.get("kind"), "path": c.get("path")}
    params = c.get("params")
    if fields["input_schema"] is None and isinstance(params, dict):
        # ``params`` is the flat form under another name; converted and checked as one.
        converted = as_json_schema(params, f"{at}.params", problems, force_flat=True)
        fields["input_schema"] = converted
        # Each parameter checked where the author wrote it, not at a schema they never wrote.
        checks = {f"{at}.params.{name}": schema
                  for name, schema in converted["properties"].items()}
        return f"{at}.id", fields, {**checks, f"{at}.output_schema": fields["output_schema"]}
    _flatten_schemas(at, fields, problems)
    return f"{at}.id", fields, _schema_checks(at, fields)


def _flatten_schemas(at: str, fields: dict[str, Any], problems: Problems) -> None:
    """Convert flat-form input/output schemas (``field: {type, required}``) in place."""
    for key in ("input_schema", "output_schema"):
        if isinstance(fields.get(key), dict):
            fields[key] = as_json_schema(fields[key], f"{at}.{key}", problems)


def _reached(src: dict[str, Any], at: str, problems: Problems) -> dict[str, Any]:
    """How the agent is reached: protocol, internal-only, pool and credential, from a
    JSON descriptor's ``reach`` block or an operator's entry."""
    prefix = f"{at}." if at else ""
    pool = _obj(src.get("pool"))
    idle = pool.get("idle_timeout")
    if idle is not None and _seconds(idle) == 0:
        _add(problems, f"{prefix}pool.idle_timeout", "must be at least 1 second")
    return {
        "protocol": src.get("protocol"),
        "internal_only": src.get("internal_only"),
        "pool_max_connections": pool.get("max_conns"),
        "pool_idle_seconds": _seconds(idle) if idle is not None else None,
        "credential": _credential(src.get("auth"), f"{prefix}auth", problems),
    }


# auth.type -> (the credential kind, fields it needs, fields it may have)
_AUTH_FIELDS: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    "header": ("header", ("key", "value_env"), ()),
    "query": ("query", ("key", "value_env"), ()),
    "bearer": ("bearer", ("value_env",), ()),
    "cert": ("mtls", ("client_cert",), ("ca_file", "client_key", "client_key_env")),
}


def _credential(raw: object, at: str, problems: Problems) -> CredentialSpec | None:
    """The owner tenant's credential an ``auth`` block describes (schema already checked)."""
    if not isinstance(raw, dict) or raw.get("type") not in _AUTH_FIELDS:
        return None
    auth = dict(raw)
    if "token_env" in auth and auth.get("type") == "bearer":
        if "value_env" in auth:
            _add(problems, f"{at}.token_env", "give value_env or token_env, not both")
        auth.setdefault("value_env", auth.pop("token_env"))
    kind, needed, optional = _AUTH_FIELDS[auth["type"]]
    for name in needed:
        if not auth.get(name):
            _add(problems, f"{at}.{name}", f"is required for type {auth['type']}")
    if kind == "mtls" and bool(auth.get("client_key")) == bool(auth.get("client_key_env")):
        _add(problems, f"{at}.client_key_env",
             "give exactly one of client_key (a file) and client_key_env")
    known = schemas._DEFS["auth"]["properties"]
    for name in (set(auth) & set(known)) - {"type", *needed, *optional}:
        _add(problems, f"{at}.{name}", f"does not apply to type {auth['type']}")
    return CredentialSpec(
        kind=kind,
        field_name=auth.get("key", "") if kind in ("header", "query") else "",
        value_env=auth.get("value_env") or auth.get("client_key_env") or "",
        client_cert_path=auth.get("client_cert", ""),
        client_key_path=auth.get("client_key", ""),
        ca_file=auth.get("ca_file", ""),
    )


_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}


def _seconds(raw: object) -> int | None:
    """``90``, ``"90s"``, ``"2m"`` or ``"1500ms"`` as whole seconds (at least 1)."""
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        value = float(raw)
    elif isinstance(raw, str) and (found := re.fullmatch(r"([0-9.]+)(ms|s|m|h)?", raw)):
        try:
            value = float(found[1]) * _UNIT_SECONDS[found[2] or "s"]
        except ValueError:
            return None
    else:
        return None
    return math.ceil(value)


# Words a capability.yaml's ``language`` uses for what the agent is written in; they
# look like language codes (go, js) but are not natural languages.
_PROGRAMMING_LANGUAGES = frozenset({"go", "js", "ts", "c", "cpp", "cs", "rs", "py", "rb"})


def _natural_language(value: str) -> bool:
    return (re.fullmatch(schemas.LANGUAGE_PATTERN, value) is not None
            and value.lower() not in _PROGRAMMING_LANGUAGES)


def _prefixed(problems: Problems, at: str) -> Problems:
    """Problems found inside ``at`` (an entry of an ``agents`` list) keyed from the top."""
    if not at:
        return problems
    return {at if p == "$" else f"{at}{'' if p.startswith('[') else '.'}{p}": m
            for p, m in problems.items()}


def _described(src: dict[str, Any]) -> dict[str, Any]:
    return {k: src.get(k)
            for k in ("display_name", "description", "keywords", "examples", "not_for")}


def _reach_fields(src: dict[str, Any]) -> dict[str, Any]:
    """CapabilitySpec fields every format spells alike (the card in ``x-reach``)."""
    rate = _obj(src.get("rate_limit"))
    return {
        "languages": src.get("languages"),
        "directions": src.get("direction"),
        "input_schema": src.get("input_schema"),
        "output_schema": src.get("output_schema"),
        "timeout_ms": src.get("timeout_ms"),
        "qps": rate.get("qps"),
        "burst": rate.get("burst"),
        "version": src.get("version"),
        # Declarative request template and response mapping for plain-HTTP agents.
        "adapter": {k: src[k] for k in ("request", "response") if isinstance(src.get(k), dict)}
        or None,
    }


def _schema_checks(at: str, src: dict[str, Any]) -> dict[str, Any]:
    return {f"{at}.{key}": src.get(key) for key in ("input_schema", "output_schema")}



def _capability(fields: dict[str, Any]) -> CapabilitySpec:
    """Build from fields that passed validation; copies schemas so the spec aliases nothing."""
    directions = fields.get("directions")
    built = {
        **fields,
        "display_name": _text(fields.get("display_name")),
        "description": _text(fields.get("description")),
        "keywords": _unique(fields.get("keywords")),
        "examples": _unique(fields.get("examples")),
        "not_for": _unique(fields.get("not_for")),
        "languages": _unique(fields.get("languages")),
        "directions": _unique([directions] if isinstance(directions, str) else directions),
        "input_schema": copy.deepcopy(fields.get("input_schema")),
        "output_schema": copy.deepcopy(fields.get("output_schema")),
        "adapter": copy.deepcopy(fields.get("adapter")),
    }
    built |= {key: _int(built[key]) for key in _CAPABILITY_INTS if key in built}
    return CapabilitySpec(**_given(built))


def _folded(raw: object, limit: int, path: str, problems: Problems) -> str | None:
    """Fold free text into an id: ASCII, lower-case, other runs -> '-', alnum at the start."""
    if not isinstance(raw, str):
        return None
    ascii_text = unicodedata.normalize("NFKD", raw).encode("ascii", "ignore").decode()
    folded = _NOT_IN_ID.sub("-", ascii_text.lower()).strip("-_.")[:limit].rstrip("-_.")
    if not folded:
        _add(problems, path, "needs at least one letter or digit")
    return folded or None


def _with_tls(endpoint: str) -> str:
    return "https://" + endpoint[len("http://") :] if endpoint.startswith("http://") else endpoint


def _yaml_reason(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    reason = getattr(exc, "problem", None) or str(exc)
    return f"{reason} (line {mark.line + 1}, column {mark.column + 1})" if mark else reason


# -- small helpers --------------------------------------------------------------


def _path(parts: Iterable[str | int]) -> str:
    """``["capabilities", 2, "timeout_ms"]`` -> ``capabilities[2].timeout_ms``; ``[]`` -> ``$``."""
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "$"


def _add(problems: Problems, path: str, message: str) -> None:
    messages = problems.setdefault(path, [])
    if message not in messages:
        messages.append(message)


def _dicts(items: object) -> list[tuple[int, dict[str, Any]]]:
    """The mapping entries of a list, with their indexes; the schema reports the rest."""
    if not isinstance(items, list):
        return []
    return [(i, item) for i, item in enumerate(items) if isinstance(item, dict)]


def _obj(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _is_int(value: object) -> bool:
    if isinstance(value, float):
        return value.is_integer()  # false for inf and nan too
    return isinstance(value, int) and not isinstance(value, bool)


def _int(value: object) -> int | None:
    """``value`` as an int when it is integral; only called after validation."""
    return int(value) if isinstance(value, int | float) and _is_int(value) else None


def _text(value: object) -> str | None:
    return value.strip() if isinstance(value, str) else None


def _unique(values: list[str] | None) -> tuple[str, ...]:
    """Stripped, non-empty, first occurrence kept: authors repeat keywords across lists."""
    return tuple(dict.fromkeys(v.strip() for v in values or () if v.strip()))


def _given(values: dict[str, Any]) -> dict[str, Any]:
    """Drop the fields the author left out, so the dataclass defaults apply."""
    return {k: v for k, v in values.items() if v is not None}
