"""A caller's input as the capability's schema states it: own names, defaults.

Callers use the registry's canonical parameter names (``dest_lang``); a caller that
uses the agent's own name (``target_lang``) means the same and is understood. A
property the schema gives a ``default`` and the caller left out gets it, so the
agent sees what its descriptor promised ("target_lang defaults to zh").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.protocols.base import thaw
from reach_core.errors import ReachError
from routing.table import CapabilityEntry

_NO_DEFAULTS: dict[str, Any] = {}


class Defaults:
    """Top-level property defaults per schema object in the route table, computed once."""

    def __init__(self) -> None:
        self._cache: dict[int, tuple[object, dict[str, Any]]] = {}

    def of(self, schema: Mapping) -> dict[str, Any]:
        cached = self._cache.get(id(schema))
        if cached is None or cached[0] is not schema:
            properties = schema.get("properties") if schema else None
            found = {
                name: thaw(sub["default"]) for name, sub in (properties or {}).items()
                if isinstance(sub, Mapping) and "default" in sub
            } if isinstance(properties, Mapping) else _NO_DEFAULTS
            if len(self._cache) > 10_000:
                self._cache.clear()
            cached = self._cache[id(schema)] = (schema, found)
        return cached[1]


def canonical_input(capability: CapabilityEntry, payload: dict, defaults: Defaults) -> dict:
    """``payload`` with the agent's own names made canonical and defaults filled in."""
    own_names = capability.param_map
    fill = defaults.of(capability.input_schema)
    if not (own_names or fill):
        return payload
    out = dict(payload)
    for canonical, own in own_names.items():
        if own in out and canonical != own:
            if canonical in out:
                # Two names for one parameter: which one was meant is a guess.
                raise ReachError("invalid_input", f"'{canonical}' and '{own}' name the same "
                                 "parameter: give one", details={
                                     own: [f"is the agent's name for {canonical}"]})
            out[canonical] = out.pop(own)
    for name, value in fill.items():
        if name not in out:
            # A fresh copy each call: a mutable default must not be shared across calls.
            out[name] = thaw(value)
    return out
