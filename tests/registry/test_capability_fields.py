"""The capability declarations agree: spec and route-table fields are model fields.

Registration copies every ``CapabilitySpec`` field onto the same-named model field,
and the snapshot reads every ``CapabilityEntry`` field from one; setting a name the
model lacks would silently store nothing.
"""

from __future__ import annotations

import dataclasses

import pytest

from registry.models import Capability
from registry.spec import CapabilitySpec
from routing.table import CapabilityEntry

MODEL_FIELDS = {f.attname for f in Capability._meta.concrete_fields} | {"pk"}


@pytest.mark.parametrize("declaration", [CapabilitySpec, CapabilityEntry])
def test_every_field_is_a_model_field(declaration: type) -> None:
    names = {f.name for f in dataclasses.fields(declaration)}
    assert names - MODEL_FIELDS == set()
