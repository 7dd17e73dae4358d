"""Bad input is a 4xx with the field's path, never a 500 (reach_platform.parsers,
reach_platform.pagination)."""

from __future__ import annotations

import pytest

from reach_platform.pagination import MAX_LIMIT
from reach_platform.parsers import MAX_DEPTH
from tests import factories
from tests.conftest import key_client
from tests.platform.test_errors import assert_error


@pytest.fixture
def alpha(world):
    return key_client(factories.api_key(tenant=world.tenant_a).plaintext)


def _post(client, path: str, body: str | bytes):
    data = body.encode("utf-8", "surrogatepass") if isinstance(body, str) else body
    return client.post(path, data=data, content_type="application/json")


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["/api/v1/grants/", "/api/v1/agents/register",
                                  "/api/v1/grants/"])
def test_a_hundred_thousand_deep_body_is_a_400(alpha, path):
    response = _post(alpha, path, "[" * 100_000 + "]" * 100_000)
    error = assert_error(response, 400, "malformed_json")
    assert "nested" in error["message"]


@pytest.mark.django_db
def test_nesting_just_past_the_limit_is_refused_and_at_it_parsed(alpha):
    deep = "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1)
    assert_error(_post(alpha, "/api/v1/grants/", deep), 400, "malformed_json")
    ok = '{"agent_id": ' + "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1) + "}"
    # Parsed fine: what fails now is the descriptor's own validation.
    assert_error(_post(alpha, "/api/v1/agents/register", ok), 400, "invalid_input")


@pytest.mark.django_db
@pytest.mark.parametrize("escaped", ["\\u0000", "\\ud800", "\\udfff"])
def test_nul_and_lone_surrogates_are_refused_naming_the_field(alpha, escaped):
    body = '{"agent_id": "x", "capabilities": [{"name": "ok"}, {"name": "a' + escaped + 'b"}]}'
    error = assert_error(_post(alpha, "/api/v1/agents/register", body), 400, "invalid_input")
    assert set(error["details"]) == {"capabilities[1].name"}
    assert "capabilities[1].name" in error["message"]


@pytest.mark.django_db
def test_a_nul_in_a_key_is_refused_too(alpha):
    error = assert_error(_post(alpha, "/api/v1/grants/", '{"na\\u0000me": 1}'),
                         400, "invalid_input")
    assert "key" in " ".join(error["details"]["na\x00me"])


@pytest.mark.django_db
def test_raw_surrogate_bytes_are_refused(alpha):
    # Not UTF-8 at all (CESU-style surrogate bytes): a parse error, not a 500.
    assert_error(_post(alpha, "/api/v1/grants/", b'{"name": "\xed\xa0\x80"}'),
                 400, "malformed_json")


@pytest.mark.django_db
def test_paired_surrogates_are_text(alpha, world):
    response = _post(alpha, "/api/v1/grants/",
                     '{"tenant": "alpha", "note": "\\ud83d\\ude00", "requests_per_minute": -1}')
    assert response.status_code == 400
    # Refused only as a field grants do not have, not for its characters.
    note = response.json()["error"]["details"]["note"]
    assert note == [m for m in note if m.startswith("is not a known field")]


@pytest.mark.django_db
def test_duplicate_keys_are_refused(alpha):
    error = assert_error(_post(alpha, "/api/v1/grants/", '{"burst": 1, "burst": 2}'),
                         400, "malformed_json")
    assert "burst" in error["message"]


@pytest.mark.django_db
def test_nan_is_not_json(alpha):
    assert_error(_post(alpha, "/api/v1/grants/", '{"burst": NaN}'), 400, "malformed_json")


@pytest.mark.django_db
@pytest.mark.parametrize("query", [
    "limit=null", "limit=-1", "limit=0", f"limit={MAX_LIMIT + 1}", "limit=" + "9" * 40,
    "limit=abc", "limit=1.5", "offset=null", "offset=-3", "offset=" + "9" * 40,
])
def test_pagination_parameters_are_validated(alpha, query):
    name = query.split("=")[0]
    error = assert_error(alpha.get(f"/api/v1/agents/?{query}"), 400, "invalid_input")
    assert set(error["details"]) == {name}


@pytest.mark.django_db
def test_valid_pagination_still_pages(alpha, world):
    factories.agent(owner=world.tenant_a, name="alpha-second")
    page = alpha.get(f"/api/v1/agents/?limit={MAX_LIMIT}&offset=0").json()
    assert page["count"] == 2
    page = alpha.get("/api/v1/agents/?limit=1&offset=1").json()
    assert len(page["results"]) == 1 and page["previous"]
    assert alpha.get("/api/v1/agents/").status_code == 200


LISTS = ["tenants", "api-keys", "grants", "credentials", "quotas", "namespaces", "agents",
         "parameter-synonyms", "capabilities", "instances", "usage/events", "usage/daily",
         "audit", "tasks", "signing-secrets", "tools", "tool-grants"]


@pytest.mark.django_db
@pytest.mark.parametrize("path", LISTS)
def test_a_list_refuses_a_parameter_it_does_not_read(alpha, path):
    """A misspelt filter silently ignored answers as if it were applied: every list
    (``?namespce=ops`` on agents listed every agent) names what it reads instead."""
    error = assert_error(alpha.get(f"/api/v1/{path}/?tenat=beta"), 400, "invalid_input")
    assert set(error["details"]) == {"tenat"}
    assert alpha.get(f"/api/v1/{path}/?limit=5&offset=0&format=json").status_code == 200


@pytest.mark.django_db
def test_a_lists_own_filters_still_filter_and_are_given_once(alpha, world):
    factories.agent(owner=world.tenant_a, name="alpha-second")
    listed = alpha.get("/api/v1/agents/?q=alpha-second&limit=10").json()
    assert [a["name"] for a in listed["results"]] == ["alpha-second"]
    assert alpha.get("/api/v1/tasks/?state=working").status_code == 200
    error = assert_error(alpha.get("/api/v1/agents/?q=a&q=b"), 400, "invalid_input")
    assert error["details"] == {"q": ["give it once"]}
    assert_error(alpha.get("/api/v1/agents/?namespce=default"), 400, "invalid_input")


@pytest.mark.django_db
def test_a_namespace_is_named_as_descriptors_name_it(api, world):
    """helper-48: "Sales" could be created through the API, and then never hold an agent
    (a descriptor's namespace is lower case)."""
    api.force_authenticate(world.superuser)
    for name in ("Sales", "sales eu", "-sales", "s" * 64):
        error = assert_error(api.post("/api/v1/namespaces/", {"name": name}, format="json"),
                             400, "invalid_input")
        assert set(error["details"]) == {"name"}, name
    assert api.post("/api/v1/namespaces/", {"name": "sales-eu"},
                    format="json").status_code == 201


@pytest.mark.django_db
def test_a_lone_surrogate_in_a_key_or_deep_yaml_is_a_400_not_a_500(world):
    from tests import factories
    from tests.conftest import key_client

    client = key_client(factories.api_key(tenant=world.tenant_a, scopes=["manage"]).plaintext)
    surrogate_key = client.post("/api/v1/agents/register",
                                data=b'{"agent_id": "x", "\\ud800": 1}',
                                content_type="application/json")
    assert surrogate_key.status_code == 400, surrogate_key.content
    assert "\\ud800" in surrogate_key.json()["error"]["message"]
    deep = client.post("/api/v1/agents/register",
                       data=("a: " + "[" * 3000 + "]" * 3000).encode(),
                       content_type="application/yaml")
    assert deep.status_code == 400, deep.content
    assert deep.json()["error"]["code"] == "invalid_input"


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["/api/v1/tenants/%00/", "/api/v1/usage/events/%00/",
                                  "/api/v1/tools/%00/", "/api/v1/namespaces/%00/",
                                  "/api/v1/agents/%00/"])
def test_a_nul_in_a_path_is_a_4xx_not_a_500(alpha, path):
    """PostgreSQL cannot compare text holding a NUL (DataError): that is the request's
    fault, answered in the one error shape."""
    response = alpha.get(path)
    assert response.status_code in (400, 404), response.content
    assert response.json()["error"]["code"] in ("invalid_input", "not_found")


@pytest.mark.django_db
def test_a_second_grant_for_the_same_slot_is_refused_not_a_500(alpha, world):
    """An empty capability is stored as none: the same grant asked again, spelt null or
    left out, is the same grant (a 400 naming the tenant; two at once meet the database's
    unique constraint: 409). A grant of an agent needs no "capability": null (a re-test
    found it required)."""
    grant = {"tenant": world.tenant_b.slug, "agent": world.agent_a.pk, "capability": ""}
    first = alpha.post("/api/v1/grants/", grant, format="json")
    assert first.status_code == 201, first.content
    for again in ({**grant, "capability": None},
                  {"tenant": world.tenant_b.slug, "agent": world.agent_a.pk}):
        refused = alpha.post("/api/v1/grants/", again, format="json")
        assert_error(refused, 400, "invalid_input")
        assert "already holds" in refused.json()["error"]["details"]["tenant"][0]
    alpha.delete(f"/api/v1/grants/{first.json()['id']}/")
    bare = alpha.post("/api/v1/grants/", {"tenant": world.tenant_b.slug,
                                          "agent": world.agent_a.pk}, format="json")
    assert bare.status_code == 201, bare.content
