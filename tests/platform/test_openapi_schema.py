from __future__ import annotations

import io

import pytest
import yaml
from django.core.management import call_command

from reach_core.errors import CATALOGUE


@pytest.mark.django_db
def test_schema_validates_without_warnings():
    out = io.StringIO()
    call_command("spectacular", "--validate", "--fail-on-warn", stdout=out)
    schema = out.getvalue()
    for path in ("/api/v1/agents/", "/api/v1/api-keys/{id}/revoke/", "/api/v1/credentials/"):
        assert path in schema
    assert "BearerAuth" in schema


@pytest.mark.django_db
def test_the_gateway_doors_are_in_the_schema_with_their_shapes_and_error_codes():
    out = io.StringIO()
    call_command("spectacular", "--validate", "--fail-on-warn", stdout=out)
    schema = yaml.safe_load(out.getvalue())
    paths = schema["paths"]
    invoke = paths["/v1/invoke"]["post"]
    assert invoke["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/InvokeRequest"}
    assert set(invoke["responses"]) >= {"200", "202", "300", "400", "401", "404", "429",
                                        "502", "503", "504"}
    assert "text/event-stream" in invoke["responses"]["200"]["content"]
    assert invoke["security"] == [{"BearerAuth": []}]
    # Every status lists codes of the catalogue that answer with that status.
    for status, response in invoke["responses"].items():
        if status.startswith(("4", "5")):
            codes = [c.strip("`") for c in response["description"].removeprefix(
                "One of: ").split(", ")]
            assert codes and all(CATALOGUE[c].status == int(status) for c in codes)
    chat = paths["/v1/chat/completions"]["post"]
    assert chat["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ChatCompletion"}
    assert "get" in paths["/v1/route"] and "post" in paths["/v1/route/feedback"]
    error = schema["components"]["schemas"]["GatewayError"]["properties"]["error"]
    assert set(error["properties"]["code"]["enum"]) == set(CATALOGUE)
