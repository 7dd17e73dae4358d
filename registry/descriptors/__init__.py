"""Agent descriptors: JSON, ``capability.yaml`` and A2A Agent Cards -> ``AgentSpec``.

Pure Python (no Django), so the registry app, CLI tools and tests can all use it.
"""

from registry.descriptors.params import normalise_params
from registry.descriptors.parse import (
    detect_and_parse,
    parse_agent_card,
    parse_capability_yaml,
    parse_json_descriptor,
)

__all__ = [
    "detect_and_parse",
    "normalise_params",
    "parse_agent_card",
    "parse_capability_yaml",
    "parse_json_descriptor",
]
