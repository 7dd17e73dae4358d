"""Rename an agent's parameters to the registry's canonical names.

Callers use one name per concept (``dest_lang``) whatever each agent calls it;
``param_map`` remembers the agent's own name so the gateway can translate back.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import replace

from registry.spec import AgentSpec, CapabilitySpec, DescriptorError


def normalise_params(spec: AgentSpec, synonyms: Mapping[str, str]) -> AgentSpec:
    """Return a copy of ``spec`` whose input parameters use canonical names.

    ``synonyms`` maps a lower-case synonym to its canonical name. Top-level
    ``input_schema.properties`` keys (and ``required`` entries) that are synonyms
    are renamed, and ``param_map[canonical] = original`` is recorded; existing
    ``param_map`` entries are kept, so normalising twice changes nothing. ``spec``
    is never mutated: every schema is deep-copied. If two properties of one
    capability would end up with the same name, raises ``DescriptorError`` at
    ``capabilities[i].input_schema.properties`` (all such capabilities listed).
    """
    problems: dict[str, list[str]] = {}
    capabilities = []
    for i, cap in enumerate(spec.capabilities):
        renamed, clashes = _renamed(cap, synonyms)
        if clashes:
            problems[f"capabilities[{i}].input_schema.properties"] = clashes
        capabilities.append(renamed)
    if problems:
        raise DescriptorError(problems)
    return replace(spec, capabilities=tuple(capabilities))


def _renamed(cap: CapabilitySpec, synonyms: Mapping[str, str]) -> tuple[CapabilitySpec, list[str]]:
    """``cap`` with canonical parameter names, or unchanged plus messages on a clash."""
    schema = copy.deepcopy(cap.input_schema)
    copied = replace(cap, input_schema=schema, output_schema=copy.deepcopy(cap.output_schema))
    properties = schema.get("properties")
    if not isinstance(properties, dict):
        return copied, []
    renames = {
        name: synonyms[name.lower()]
        for name in properties
        if isinstance(name, str) and synonyms.get(name.lower(), name) != name
    }
    claimants: dict[str, list[str]] = {}
    for name in properties:
        claimants.setdefault(renames.get(name, name), []).append(name)
    clashes = [
        f"{' and '.join(map(repr, names))} would {'both' if len(names) == 2 else 'all'} "
        f"be named {canonical!r}"
        for canonical, names in claimants.items()
        if len(names) > 1
    ]
    if clashes or not renames:
        return copied, clashes
    schema["properties"] = {renames.get(name, name): sub for name, sub in properties.items()}
    if isinstance(schema.get("required"), list):
        schema["required"] = [renames.get(name, name) for name in schema["required"]]
    param_map = {**cap.param_map, **{canonical: name for name, canonical in renames.items()}}
    return replace(copied, param_map=param_map), []
