"""Schemathesis over the control-plane REST API, served by a real uvicorn on loopback.

Every operation of the published OpenAPI document (``/api/schema/``) goes through all
four phases (examples, coverage, fuzzing, stateful) with the checks
``not_a_server_error``, ``response_schema_conformance``, ``negative_data_rejection``,
``ignored_auth`` and ``use_after_free``; the test passes only with no failure.

The fuzzer acts as a tenant's API key with every scope. Nothing is excluded: the schema
holds only the REST API (``SCHEMA_PATH_PREFIX``), not the admin or the HTML docs.
"""

from __future__ import annotations

import threading

import pytest
import schemathesis
from click.testing import CliRunner
from django.conf import settings
from django.db import connection
from hypothesis.configuration import set_hypothesis_home_dir
from schemathesis.cli import schemathesis as schemathesis_cli

from tenants.choices import ApiKeyScope
from tenants.models import Tenant
from tests import factories
from tests.gateway.conftest import database_url
from tests.support.servers import free_port, platform_env, running, uvicorn_args

CHECKS = "not_a_server_error,response_schema_conformance,negative_data_rejection," \
    "ignored_auth,use_after_free"
PHASES = "examples,coverage,fuzzing,stateful"
# Generated cases per operation in the fuzzing and stateful phases. The coverage phase's
# edge cases (about 3,000 requests) do not depend on it and take most of the run's ~95 s.
MAX_EXAMPLES = 5


class TenantKeyAuth:
    """A working ``manage`` key of the fuzzed tenant for every generated request.

    The fuzzer is allowed to revoke its own key (``POST /api-keys/{id}/revoke/``) and to
    switch its own tenant off (``PATCH /tenants/{slug}/`` with ``is_active: false``), and
    finds both through the list responses. Either turns every later request into a 401,
    which would leave the rest of the run testing nothing: on a 401, schemathesis asks
    here again (``retry_on``) and replays the request with a fresh key of the re-activated
    tenant. Requests sent without a key on purpose (``ignored_auth``) are never replayed.
    """

    tenant_pk: int  # set by a subclass: schemathesis instantiates the class without arguments
    _lock = threading.Lock()

    def get(self, case, ctx) -> str:
        with self._lock:
            try:
                Tenant.objects.filter(pk=self.tenant_pk).update(is_active=True)
                tenant = Tenant.objects.get(pk=self.tenant_pk)
                return factories.api_key(tenant=tenant, scopes=list(ApiKeyScope),
                                         name="fuzzer").plaintext
            finally:
                # Called from schemathesis's worker threads: their connections must not
                # outlive the test, or the test database could not be flushed and dropped.
                if threading.current_thread() is not threading.main_thread():
                    connection.close()

    def set(self, case, data: str, ctx) -> None:
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {data}"}


@pytest.fixture
def platform(transactional_db, tmp_path):
    """The platform under uvicorn on the test database, with one tenant holding an agent,
    a capability and an instance, so operations on ``{id}`` find rows from the start."""
    factories.seed_defaults()
    tenant = factories.tenant(slug="fuzzed", name="Fuzzed")
    agent = factories.agent(owner=tenant, name="fuzzed-agent")
    factories.capability(agent=agent)
    factories.instance(agent=agent)
    env = platform_env(
        tmp_path, DATABASE_URL=database_url(),
        REACH_CREDENTIAL_KEYS=",".join(settings.CREDENTIAL_KEYS),
        # ignored_auth sends wrong keys on purpose, hundreds of them: past the failed
        # authentication limit every request from loopback would be a 429.
        REACH_AUTH_FAILURE_LIMIT="0",
    )
    if settings.REDIS_URL:
        env |= {"REDIS_URL": settings.REDIS_URL,
                "REACH_REDIS_KEY_PREFIX": settings.REDIS_KEY_PREFIX}
    port = free_port()
    with running(uvicorn_args(port), env=env, port=port, log=tmp_path / "platform.log") as base:
        yield base, tenant


def test_the_api_survives_schemathesis(platform, tmp_path, monkeypatch):
    base, tenant = platform
    # Schemathesis keeps a cache of past failures (replayed first) under the working
    # directory: each run starts clean, and nothing is written into the repository.
    # Hypothesis's own files (constants, Unicode tables) likewise go to the test's directory.
    monkeypatch.chdir(tmp_path)
    set_hypothesis_home_dir(tmp_path / ".hypothesis")
    schemathesis.auth(retry_on=[401])(
        type("FuzzedTenantKeyAuth", (TenantKeyAuth,), {"tenant_pk": tenant.pk}))
    try:
        result = CliRunner().invoke(schemathesis_cli, [
            "run", f"{base}/api/schema/",
            "--phases", PHASES, "--checks", CHECKS,
            "--max-examples", str(MAX_EXAMPLES),
            # The same cases on every run (which also means no example database on disk).
            "--generation-deterministic",
            # Health checks time data generation: on a busy machine they fail a correct API.
            "--suppress-health-check", "all",
            # One worker: schemathesis runs in this process, and compiling its generators in
            # several threads at once trips CPython 3.11 ("AST constructor recursion depth").
            "--workers", "1", "--request-timeout", "10",
            "--no-color", "--output-truncate", "false",
        ], catch_exceptions=False)
    finally:
        schemathesis.auths.unregister()
    assert result.exit_code == 0, result.output
