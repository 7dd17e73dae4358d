"""What the SDK and the sidecar make of their configuration, before any network."""

from __future__ import annotations

import pytest
import yaml

from agent_reach import Agent
from agent_reach.sidecar import SidecarConfig
from registry.descriptors.parse import parse_json_descriptor

CAPABILITY_YAML = """
name: yaml-agent
version: 1.2.0
capabilities:
  - id: yaml.declared
    description: has its endpoint
    endpoints: [{path: /do-it}]
  - id: yaml.undeclared
    description: says nothing of where it is served
"""


def test_a_capability_yaml_without_endpoints_registers_the_path_it_is_served_at():
    agent = Agent.from_yaml(CAPABILITY_YAML)

    @agent.capability("yaml.declared")
    def declared(input, ctx):
        return {}

    @agent.capability("yaml.undeclared")
    def undeclared(input, ctx):
        return {}

    registered = yaml.safe_load(agent.descriptor("http://127.0.0.1:9/"))
    paths = {c["id"]: c["endpoints"][0]["path"] for c in registered["capabilities"]}
    served = {c.capability_id: c.path for c in agent.capabilities.values()}
    assert paths == served == {"yaml.declared": "/do-it",
                               "yaml.undeclared": "/capabilities/yaml.undeclared"}


@pytest.mark.parametrize(("text", "expected"), [
    (None, "cannot read the config"),
    ("platform: [unclosed", "not valid YAML"),
    ("platform: http://127.0.0.1:9\nkey: k\nservice: http://127.0.0.1:8\n"
     "helth: /up\nagent: {name: a}\n", "unknown setting(s) helth"),
    ("platform: http://127.0.0.1:9\nservice: http://127.0.0.1:8\nagent: {name: a}\n",
     "key_env: names no set environment variable"),
])
def test_a_bad_sidecar_config_is_one_clear_line(tmp_path, text, expected):
    path = tmp_path / "sidecar.yaml"
    if text is not None:
        path.write_text(text)
    with pytest.raises(SystemExit) as exited:
        SidecarConfig.load(path)
    assert expected in str(exited.value) and str(path) in str(exited.value)


def test_the_sdk_sends_a_capabilitys_examples_and_not_for():
    agent = Agent("hinted")

    @agent.capability("orders.status", examples=("Where is order 1234?",),
                      not_for=["parcel tracking (use logistics.track)"])
    def status(input, ctx):
        return {}

    @agent.capability("orders.cancel")
    def cancel(input, ctx):
        return {}

    descriptor = agent.descriptor("http://127.0.0.1:9/")
    caps = descriptor["capabilities"]
    assert caps[0]["examples"] == ["Where is order 1234?"]
    assert caps[0]["not_for"] == ["parcel tracking (use logistics.track)"]
    assert "examples" not in caps[1] and "not_for" not in caps[1]
    parsed = parse_json_descriptor(descriptor).capabilities[0]  # what the platform reads
    assert parsed.examples == ("Where is order 1234?",)
    assert parsed.not_for == ("parcel tracking (use logistics.track)",)
    with pytest.raises(TypeError, match="examples is a list of strings"):
        agent.capability("orders.refund", examples="Refund order 1234")


def test_a_capability_yaml_keeps_its_own_hints_and_takes_the_decorators_otherwise():
    agent = Agent.from_yaml(CAPABILITY_YAML.replace(
        "    description: has its endpoint\n",
        "    description: has its endpoint\n    examples: [from the file]\n"))

    @agent.capability("yaml.declared", examples=["from the decorator"])
    def declared(input, ctx):
        return {}

    @agent.capability("yaml.undeclared", examples=["from the decorator"], not_for=["x (use y)"])
    def undeclared(input, ctx):
        return {}

    registered = yaml.safe_load(agent.descriptor("http://127.0.0.1:9/"))
    hints = {c["id"]: (c.get("examples"), c.get("not_for")) for c in registered["capabilities"]}
    assert hints == {"yaml.declared": (["from the file"], None),
                     "yaml.undeclared": (["from the decorator"], ["x (use y)"])}
