"""What the SDK and the sidecar make of their configuration, before any network."""

from __future__ import annotations

import pytest
import yaml

from agent_reach import Agent
from agent_reach.sidecar import SidecarConfig

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
