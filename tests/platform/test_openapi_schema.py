from __future__ import annotations

import io

import pytest
from django.core.management import call_command


@pytest.mark.django_db
def test_schema_validates_without_warnings():
    out = io.StringIO()
    call_command("spectacular", "--validate", "--fail-on-warn", stdout=out)
    schema = out.getvalue()
    for path in ("/api/v1/agents/", "/api/v1/api-keys/{id}/revoke/", "/api/v1/credentials/"):
        assert path in schema
    assert "BearerAuth" in schema
