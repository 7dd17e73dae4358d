"""Descriptor parsing: three formats, one AgentSpec, every problem reported at once."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from registry.descriptors import (
    detect_and_parse,
    normalise_params,
    parse_agent_card,
    parse_capability_yaml,
    parse_json_descriptor,
)
from registry.descriptors.schemas import (
    AGENT_CARD_SCHEMA,
    CAPABILITY_YAML_SCHEMA,
    JSON_DESCRIPTOR_SCHEMA,
)
from registry.spec import AgentSpec, CapabilitySpec, DescriptorError

EXAMPLES = Path(__file__).parent / "examples"
SYNONYMS = {
    "target_lang": "dest_lang",
    "language": "dest_lang",
    "to_language": "dest_lang",
    "lang_to": "dest_lang",
}


def _json(name: str) -> Any:
    return json.loads((EXAMPLES / name).read_text(encoding="utf-8"))


def _problems(parse: Any, body: object) -> dict[str, list[str]]:
    with pytest.raises(DescriptorError) as caught:
        parse(body)
    return caught.value.problems


def _descriptor(**overrides: Any) -> dict[str, Any]:
    """A minimal valid JSON descriptor, changed by ``overrides``."""
    return {"name": "echo", "capabilities": [{"id": "echo.text"}], **overrides}


def _without_param_map(caps: tuple[CapabilitySpec, ...]) -> tuple[CapabilitySpec, ...]:
    return tuple(replace(cap, param_map={}) for cap in caps)


# -- the three example files ----------------------------------------------------------


@pytest.fixture(scope="module")
def examples() -> dict[str, AgentSpec]:
    return {
        "json": parse_json_descriptor(_json("translator.json")),
        "yaml": parse_capability_yaml(
            (EXAMPLES / "translator.capability.yaml").read_text(encoding="utf-8")
        ),
        "a2a": parse_agent_card(_json("translator.agent-card.json")),
    }


def test_examples_normalise_to_identical_capabilities(examples: dict[str, AgentSpec]) -> None:
    specs = {fmt: normalise_params(spec, SYNONYMS) for fmt, spec in examples.items()}
    caps = {fmt: _without_param_map(spec.capabilities) for fmt, spec in specs.items()}

    assert caps["json"] == caps["yaml"] == caps["a2a"]
    assert [c.capability_id for c in caps["json"]] == ["translate.text", "summarize.text"]
    for spec in specs.values():
        assert (spec.name, spec.version, spec.team) == ("translator", "2.1.0", "lingua")
        assert spec.endpoint == "http://127.0.0.1:9101/"
    assert specs["json"].capabilities[0].param_map == {"dest_lang": "target_lang"}
    assert specs["yaml"].capabilities[0].param_map == {"dest_lang": "to_language"}
    assert specs["a2a"].capabilities[0].param_map == {"dest_lang": "lang_to"}
    assert all(spec.capabilities[1].param_map == {} for spec in specs.values())


def test_examples_carry_the_documented_values(examples: dict[str, AgentSpec]) -> None:
    translate, summarize = normalise_params(examples["json"], SYNONYMS).capabilities

    assert translate.display_name == "Text translation"
    assert translate.languages == ("en", "zh", "ja")
    assert {"en->zh", "zh->en", "en->ja"} <= set(translate.directions)
    assert list(translate.input_schema["properties"]) == ["text", "dest_lang"]
    assert translate.input_schema["required"] == ["text", "dest_lang"]
    assert (translate.timeout_ms, translate.qps, translate.burst, translate.kind) == (
        8000,
        20,
        40,
        "sync",
    )
    assert summarize.display_name == "Summarisation"
    assert summarize.output_schema["properties"]["summary"]["type"] == "string"
    assert (summarize.timeout_ms, summarize.kind) == (15000, "stream")


def test_examples_keep_their_format_and_protocol(examples: dict[str, AgentSpec]) -> None:
    assert {fmt: spec.source_format for fmt, spec in examples.items()} == {
        "json": "json",
        "yaml": "yaml",
        "a2a": "a2a",
    }
    assert [spec.protocol for spec in examples.values()] == ["http", "http", "a2a"]
    assert examples["json"].lease_ttl_seconds == examples["yaml"].lease_ttl_seconds == 30


@pytest.mark.parametrize(
    "schema", [JSON_DESCRIPTOR_SCHEMA, CAPABILITY_YAML_SCHEMA, AGENT_CARD_SCHEMA]
)
def test_schemas_are_valid_draft_2020_12(schema: dict[str, Any]) -> None:
    Draft202012Validator.check_schema(schema)


# -- errors: all of them, at their paths ----------------------------------------------


def test_invalid_example_lists_every_problem_in_one_error() -> None:
    problems = _problems(parse_json_descriptor, _json("invalid.json"))

    assert problems["capabilities[2].timeout_ms"] == ["must be a positive integer"]
    assert problems["name"] == ["is required (or agent_id)"]
    assert problems["capabilities[0].kind"] == ["must be one of: sync, stream, async"]
    assert problems["capabilities[1].input_schema"] == ["must be an object"]
    assert problems["reach.protocol"] == [
        "grpc is not supported: the gateway speaks http (raw-http), openai (openai-compatible) "
        "and a2a"
    ]
    assert problems["reach.endpoint"] == ["must be an http:// or https:// URL"]
    assert "liveness.ttl_seconds" in problems
    assert len(problems) == 7


def test_ttl_shorter_than_three_heartbeats_is_rejected() -> None:
    body = _descriptor(liveness={"ttl_seconds": 20, "heartbeat_interval_seconds": 10})

    (message,) = _problems(parse_json_descriptor, body)["liveness.ttl_seconds"]
    assert "3 \N{MULTIPLICATION SIGN} heartbeat_interval_seconds" in message

    ok = parse_json_descriptor(
        _descriptor(liveness={"ttl_seconds": 30, "heartbeat_interval_seconds": 10})
    )
    assert (ok.lease_ttl_seconds, ok.heartbeat_interval_seconds) == (30, 10)


def test_ttl_defaults_to_cover_three_heartbeats() -> None:
    spec = parse_json_descriptor(_descriptor(liveness={"heartbeat_interval_seconds": 20}))

    assert (spec.lease_ttl_seconds, spec.heartbeat_interval_seconds) == (60, 20)


def test_duplicate_capability_ids_are_reported_at_the_repeat() -> None:
    body = _descriptor(capabilities=[{"id": "echo.text"}, {"type": "ping"}, {"id": "echo.text"}])

    problems = _problems(parse_json_descriptor, body)

    assert list(problems) == ["capabilities[2].id"]
    assert "capabilities[0].id" in problems["capabilities[2].id"][0]


def test_input_schema_must_be_a_valid_json_schema() -> None:
    body = _descriptor(
        capabilities=[
            {"id": "a", "input_schema": {"type": "object", "properties": {"x": {"type": "strin"}}}},
            {"id": "b", "output_schema": {"type": "object", "required": "x"}},
        ]
    )

    problems = _problems(parse_json_descriptor, body)

    (message,) = problems["capabilities[0].input_schema"]
    assert message.startswith("not a valid JSON Schema: ")
    assert "properties.x.type" in message
    assert problems["capabilities[1].output_schema"][0].startswith("not a valid JSON Schema: ")


def test_a_schema_whose_checks_multiply_is_refused() -> None:
    """25 levels of ``anyOf`` pairs of references: 1 KB that would check one value 2^25
    times in the gateway (a break test froze one; registration had answered 201)."""
    defs: dict[str, Any] = {"d0": {"type": "integer"}}
    for n in range(1, 26):
        defs[f"d{n}"] = {"anyOf": [{"$ref": f"#/$defs/d{n - 1}"}] * 2}
    bomb = {"type": "object", "$defs": defs, "properties": {"x": {"$ref": "#/$defs/d25"}}}
    body = _descriptor(capabilities=[{"id": "a", "input_schema": bomb},
                                     {"id": "b", "output_schema": bomb}])

    problems = _problems(parse_json_descriptor, body)

    for field in ("capabilities[0].input_schema", "capabilities[1].output_schema"):
        assert "more than 1000 subschemas" in problems[field][0], problems


def test_non_object_body_is_reported_at_the_root() -> None:
    assert _problems(parse_json_descriptor, ["not", "a", "descriptor"]) == {
        "$": ["must be an object"]
    }


def test_missing_capability_id_and_empty_capabilities() -> None:
    assert _problems(parse_json_descriptor, _descriptor(capabilities=[{"kind": "sync"}])) == {
        "capabilities[0].id": ["is required (or type)"]
    }
    assert _problems(parse_json_descriptor, _descriptor(capabilities=[])) == {
        "capabilities": ["must not be empty"]
    }


def test_bad_names_languages_and_limits_use_short_messages() -> None:
    body = _descriptor(
        name="bad name",
        namespace="Prod Space",
        capabilities=[
            {
                "id": "Echo",
                "languages": ["english"],
                "direction": "en-zh",
                "timeout_ms": 600_001,
                "rate_limit": {"qps": 0, "burst": "many"},
            }
        ],
        reach={"weight": True, "use_tls": "yes"},
    )

    problems = _problems(parse_json_descriptor, body)

    assert problems["name"][0].startswith("must be 1-100 letters")
    assert problems["namespace"][0].startswith("must be a slug")
    assert problems["capabilities[0].id"][0].startswith("must be 1-128 lower-case")
    assert problems["capabilities[0].languages[0]"] == [
        "must be a language code like en or zh-Hans"
    ]
    assert problems["capabilities[0].direction"] == ["must read like en->zh"]
    assert problems["capabilities[0].timeout_ms"] == ["must be at most 600000"]
    assert problems["capabilities[0].rate_limit.qps"] == ["must be a positive integer"]
    assert problems["capabilities[0].rate_limit.burst"] == ["must be a positive integer"]
    assert problems["reach.weight"] == ["must be a positive integer"]
    assert problems["reach.use_tls"] == ["must be true or false"]


def test_trailing_newline_does_not_slip_past_the_name_pattern() -> None:
    assert "name" in _problems(parse_json_descriptor, _descriptor(name="echo\n"))


# -- JSON descriptor specifics ----------------------------------------------------------


def test_use_tls_upgrades_an_http_endpoint() -> None:
    reach = {"endpoint": "http://10.0.0.5:9101/v1", "use_tls": True}

    assert parse_json_descriptor(_descriptor(reach=reach)).endpoint == "https://10.0.0.5:9101/v1"
    reach["use_tls"] = False
    assert parse_json_descriptor(_descriptor(reach=reach)).endpoint == "http://10.0.0.5:9101/v1"


def test_agent_id_wins_over_name() -> None:
    spec = parse_json_descriptor(_descriptor(agent_id="echo-2"))

    assert spec.name == "echo-2"
    assert spec.namespace == "default"


def test_unknown_keys_are_refused_at_their_own_paths_in_every_format() -> None:
    """Nothing an author wrote is dropped without a word: a key the registry does not
    understand is a 400 naming it, at any depth and in every format."""
    json_problems = _problems(parse_json_descriptor, _descriptor(
        owner="someone",
        reach={"endpoint": "http://127.0.0.1:9000/", "wieght": 3},
        capabilities=[{"id": "echo.text", "rate_limit": {"qps": 1, "bursts": 2}}],
    ))
    yaml_problems = _problems(parse_capability_yaml, (
        "name: echo\nmetadata: {owner_team: t, oncall: me}\n"
        "capabilities:\n  - {id: echo.text, endpoints: [{path: /e, verb: POST}]}\n"))
    card_problems = _problems(parse_agent_card, {
        "name": "echo", "url": "http://127.0.0.1:9000/", "colour": "red",
        "skills": [{"id": "e", "name": "E", "x-reach": {"timeout": 5}}]})

    assert set(json_problems) == {"owner", "reach.wieght", "capabilities[0].rate_limit.bursts"}
    assert all(m[0].startswith("is not a known field") for m in json_problems.values())
    assert "weight" in json_problems["reach.wieght"][0]  # says what would have been understood
    assert set(yaml_problems) == {"metadata.oncall", "capabilities[0].endpoints[0].verb"}
    assert set(card_problems) == {"colour", "skills[0].x-reach.timeout"}


def test_an_a2a_cards_standard_fields_are_accepted_and_kept_with_the_document() -> None:
    card = {"name": "echo", "url": "http://127.0.0.1:9000/", "protocolVersion": "0.3.0",
            "preferredTransport": "JSONRPC", "iconUrl": "http://127.0.0.1:9000/i.png",
            "securitySchemes": {}, "capabilities": {"streaming": True, "pushNotifications": False},
            "skills": [{"id": "echo", "name": "Echo", "examples": ["hi"], "security": []}]}

    spec = parse_agent_card(card)

    assert spec.document == card
    assert spec.capabilities[0].kind == "stream"


def test_params_become_the_input_schema_when_none_is_given() -> None:
    cap = {"id": "echo.text", "params": {"text": {"type": "string"}}, "type": "ignored-when-id"}

    (spec,) = parse_json_descriptor(_descriptor(capabilities=[cap])).capabilities

    assert spec.capability_id == "echo.text"
    assert spec.input_schema == {"type": "object", "properties": {"text": {"type": "string"}}}
    flat = {"id": "echo.text", "params": {"text": {"type": "string", "required": True}}}
    (spec,) = parse_json_descriptor(_descriptor(capabilities=[flat])).capabilities
    assert spec.input_schema["required"] == ["text"]
    bad = {"id": "echo.text", "params": {"text": {"type": 5}}}
    assert "capabilities[0].params.text" in _problems(
        parse_json_descriptor, _descriptor(capabilities=[bad])
    )


def test_keywords_are_deduplicated_in_order_and_directions_accept_a_string() -> None:
    cap = {"id": "t", "keywords": ["b", "a", "b", " a ", ""], "direction": "en->zh"}

    (spec,) = parse_json_descriptor(_descriptor(capabilities=[cap])).capabilities

    assert spec.keywords == ("b", "a")
    assert spec.directions == ("en->zh",)
    assert parse_json_descriptor(_descriptor()).capabilities[0].keywords == ()


def test_parsed_spec_does_not_alias_the_input() -> None:
    body = _descriptor(capabilities=[{"id": "e", "input_schema": {"type": "object"}}])

    spec = parse_json_descriptor(body)
    body["capabilities"][0]["input_schema"]["type"] = "string"

    assert spec.capabilities[0].input_schema == {"type": "object"}


# -- capability.yaml specifics -------------------------------------------------------


def test_yaml_syntax_error_names_the_line() -> None:
    text = "name: translator\ncapabilities:\n  - id: translate.text\n    timeout_ms: [8000\n"

    problems = _problems(parse_capability_yaml, text)

    assert list(problems) == ["$"]
    (message,) = problems["$"]
    assert message.startswith("not valid YAML: ")
    assert "line 5" in message


def test_yaml_default_language_comes_first_and_endpoint_gives_path() -> None:
    text = """
name: echo
language: de
capabilities:
  - id: echo.text
    languages: [fr, de]
    endpoints: [{path: /echo, protocol: openai, method: POST}]
"""
    spec = parse_capability_yaml(text)

    assert spec.protocol == "openai"
    (cap,) = spec.capabilities
    assert (cap.languages, cap.path) == (("de", "fr"), "/echo")


def test_a_declared_method_must_be_post() -> None:
    """The gateway always POSTs to a capability's path. Saying so is fine; any other
    method (or a gRPC method name) would be silently ignored, so it is refused."""
    yaml_text = "name: echo\ncapabilities:\n  - id: echo.text\n    endpoints: [{path: /echo%s}]\n"
    card = {"name": "echo", "url": "http://127.0.0.1:9000/",
            "skills": [{"id": "echo.text", "name": "Echo", "x-reach": {"path": "/echo"}}]}
    with_method = copy.deepcopy(card)
    with_method["skills"][0]["x-reach"]["method"] = "DELETE"

    assert parse_json_descriptor(
        _descriptor(capabilities=[{"id": "echo.text", "method": "POST"}])
    ).capabilities == parse_json_descriptor(_descriptor()).capabilities
    assert parse_capability_yaml(yaml_text % ", method: post").capabilities == (
        parse_capability_yaml(yaml_text % "").capabilities)
    assert list(_problems(parse_json_descriptor, _descriptor(
        capabilities=[{"id": "echo.text", "method": "GET"}]))) == ["capabilities[0].method"]
    assert "must be POST" in _problems(parse_capability_yaml, yaml_text % ", method: Summarize")[
        "capabilities[0].endpoints[0].method"][0]
    assert list(_problems(parse_agent_card, with_method)) == ["skills[0].x-reach.method"]


def test_yaml_protocols_must_agree() -> None:
    text = """
name: echo
capabilities:
  - {id: a, endpoints: [{protocol: http}]}
  - {id: b, endpoints: [{protocol: openai}]}
"""
    assert _problems(parse_capability_yaml, text) == {
        "capabilities[1].endpoints[0].protocol": ["must match the others (http)"]
    }


def test_yaml_errors_use_yaml_paths() -> None:
    text = "version: 2.1\ncapabilities:\n  - {id: a, type: batch, timeout_ms: -5}\n"

    assert _problems(parse_capability_yaml, text) == {
        "name": ["is required"],
        "version": ["must be a string"],
        "capabilities[0].type": ["must be one of: sync, stream, async"],
        "capabilities[0].timeout_ms": ["must be a positive integer"],
    }


# -- Agent Card specifics -----------------------------------------------------------------


def _card(**overrides: Any) -> dict[str, Any]:
    return {"name": "echo", "url": "http://127.0.0.1:9000/", "skills": [], **overrides}


def test_card_skill_ids_and_name_are_folded_into_valid_ids() -> None:
    skills = [
        {"id": "Translate Text!", "name": "Translate"},
        {"id": "Übersetzen/Deutsch", "name": "Übersetzen"},
        {"id": "__summarize.TEXT", "name": "Summarise"},
    ]

    spec = parse_agent_card(_card(name="Lingua Translator Pro", skills=skills))

    assert spec.name == "lingua-translator-pro"
    assert [c.capability_id for c in spec.capabilities] == [
        "translate-text",
        "ubersetzen-deutsch",
        "summarize.text",
    ]
    assert spec.protocol == "a2a"


def test_card_kind_follows_streaming_unless_x_reach_says_otherwise() -> None:
    skills = [{"id": "a", "name": "A"}, {"id": "b", "name": "B", "x-reach": {"kind": "async"}}]

    streaming = parse_agent_card(_card(capabilities={"streaming": True}, skills=skills))
    plain = parse_agent_card(_card(skills=skills))

    assert [c.kind for c in streaming.capabilities] == ["stream", "async"]
    assert [c.kind for c in plain.capabilities] == ["sync", "async"]


def test_card_problems_use_card_paths() -> None:
    skills = [
        {"id": "Echo", "name": "Echo"},
        {"id": "echo", "name": "Echo again", "x-reach": {"timeout_ms": 0}},
        {"id": "!!!", "name": "Nothing"},
        {"id": "x", "name": "X", "x-reach": {"input_schema": {"type": "nope"}}},
    ]

    problems = _problems(parse_agent_card, _card(skills=skills))

    assert set(problems) == {
        "skills[1].id",
        "skills[1].x-reach.timeout_ms",
        "skills[2].id",
        "skills[3].x-reach.input_schema",
    }
    assert problems["skills[1].id"][0].startswith("duplicate capability id 'echo'")


# -- detect_and_parse ---------------------------------------------------------------------


def test_detect_and_parse_picks_the_format() -> None:
    yaml_text = (EXAMPLES / "translator.capability.yaml").read_text(encoding="utf-8")

    assert detect_and_parse(yaml_text).source_format == "yaml"
    assert detect_and_parse(_json("translator.agent-card.json")).source_format == "a2a"
    assert detect_and_parse(_json("translator.json")).source_format == "json"
    with pytest.raises(DescriptorError):
        detect_and_parse(42)


# -- normalise_params ---------------------------------------------------------------------


def test_normalise_params_does_not_mutate_its_input(examples: dict[str, AgentSpec]) -> None:
    spec = examples["yaml"]
    before = copy.deepcopy(spec)

    normalised = normalise_params(spec, SYNONYMS)

    assert spec == before
    assert "to_language" in spec.capabilities[0].input_schema["properties"]
    assert normalised.capabilities[0].input_schema is not spec.capabilities[0].input_schema
    assert normalise_params(normalised, SYNONYMS) == normalised


def test_normalise_params_leaves_canonical_names_alone() -> None:
    schema = {"properties": {"dest_lang": {}, "Target_Lang": {}}, "required": ["Target_Lang"]}
    spec = AgentSpec("t", capabilities=(CapabilitySpec("t", input_schema=schema),))
    only_canonical = AgentSpec(
        "t", capabilities=(CapabilitySpec("t", input_schema={"properties": {"dest_lang": {}}}),)
    )
    mixed_case = AgentSpec(
        "t", capabilities=(CapabilitySpec("t", input_schema={"properties": {"Target_Lang": {}}}),)
    )

    assert normalise_params(only_canonical, SYNONYMS) == only_canonical
    (cap,) = normalise_params(mixed_case, SYNONYMS).capabilities
    assert (cap.input_schema, cap.param_map) == (
        {"properties": {"dest_lang": {}}},
        {"dest_lang": "Target_Lang"},
    )
    # A synonym next to the canonical name it maps to is a clash, not a silent overwrite.
    with pytest.raises(DescriptorError) as caught:
        normalise_params(spec, SYNONYMS)
    (message,) = caught.value.problems["capabilities[0].input_schema.properties"]
    assert "'dest_lang' and 'Target_Lang'" in message
    assert spec.capabilities[0].input_schema == schema


def test_normalise_params_reports_every_clashing_capability() -> None:
    clash = {"properties": {"language": {}, "to_language": {}}, "required": ["language"]}
    caps = (CapabilitySpec("a", input_schema=clash), CapabilitySpec("ok"))
    spec = AgentSpec("t", capabilities=(*caps, CapabilitySpec("b", input_schema=clash)))

    with pytest.raises(DescriptorError) as caught:
        normalise_params(spec, SYNONYMS)

    assert list(caught.value.problems) == [
        "capabilities[0].input_schema.properties",
        "capabilities[2].input_schema.properties",
    ]
    assert caught.value.problems["capabilities[2].input_schema.properties"] == [
        "'language' and 'to_language' would both be named 'dest_lang'"
    ]


def test_yaml_aliases_are_refused_before_they_can_expand() -> None:
    """Nine nested anchors of ten references: ~600 bytes that would expand to 10^9 values
    and hold a worker for minutes. Refused at once, naming the line."""
    lines = ["name: bomb", "a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    text = "\n".join([*lines, "capabilities:", "  - {id: c, keywords: *a8}"]) + "\n"
    assert len(text) < 1000

    problems = _problems(parse_capability_yaml, text)

    assert list(problems) == ["$"] and "aliases" in problems["$"][0]


def test_a_key_repeated_in_yaml_is_refused_not_last_one_wins() -> None:
    problems = _problems(parse_capability_yaml,
                         "name: dup1\nname: dup2\ncapabilities: [{id: c}]\n")
    assert "'name' is given twice" in problems["$"][0]


_CARD = {"name": "echo", "url": "http://127.0.0.1:9000/", "skills": [{"id": "e", "name": "E"}]}


@pytest.mark.parametrize(("card_fields", "path"), [
    ({"preferredTransport": "GRPC"}, "preferredTransport"),
    ({"security": [{"bearer": []}], "securitySchemes": {"bearer": {"type": "http"}}},
     "security"),
    ({"capabilities": {"extensions": [{"uri": "urn:x", "required": True}]}},
     "capabilities.extensions[0].required"),
])
def test_card_fields_the_gateway_cannot_honour_are_refused(card_fields, path) -> None:
    assert path in _problems(parse_agent_card, {**_CARD, **card_fields})


@pytest.mark.parametrize(("cap", "path"), [
    # A parameter beside the JSON Schema keywords constrains nothing: refused.
    ({"input_schema": {"type": "object", "b": {"type": "string", "required": True}}},
     "capabilities[0].input_schema.b"),
    ({"input_schema": {"a": "string"}}, "capabilities[0].input_schema.a"),
    # A default its own enum refuses would make every call without it a 400.
    ({"input_schema": {"type": "object", "properties": {"a": {"enum": ["x"], "default": "y"}}}},
     "capabilities[0].input_schema.properties.a.default"),
])
def test_a_schema_that_would_constrain_nothing_or_everything_is_refused(cap, path) -> None:
    assert path in _problems(parse_json_descriptor,
                             _descriptor(capabilities=[{"id": "echo.text", **cap}]))


@pytest.mark.parametrize(("reach", "path"), [
    ({"auth": {"type": "bearer", "value_env": "A", "token_env": "B"}}, "reach.auth.token_env"),
    ({"pool": {"idle_timeout": "0s"}}, "reach.pool.idle_timeout"),
])
def test_reach_fields_that_would_be_silently_changed_are_refused(reach, path) -> None:
    assert path in _problems(parse_json_descriptor, _descriptor(reach=reach))
