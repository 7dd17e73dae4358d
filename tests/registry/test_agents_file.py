"""The operator's agents file: applied as written, all or nothing with every problem
named, pruned exactly, and re-applied on every gateway within seconds of an edit."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from registry.agents_file import apply, parse_agents_file, watched_file_apply
from registry.models import Agent
from registry.spec import DescriptorError
from tenants.models import Credential
from tests import factories

EXAMPLES = Path(__file__).parent / "examples"
TWO_AGENTS = EXAMPLES / "field-report.two-agents.yaml"


@pytest.fixture
def owner(db, settings):
    # The field report's cloud agent is on a public name: an operator allows it.
    settings.UPSTREAM_ALLOW = [*settings.UPSTREAM_ALLOW, "api.example.com"]
    factories.seed_defaults()
    return factories.tenant(slug="ops")


def run(*args) -> str:
    out = io.StringIO()
    call_command("reach_apply", *map(str, args), stdout=out)
    return out.getvalue()


def test_the_field_reports_two_agents_are_created_as_written(owner):
    dry = run(TWO_AGENTS, "--tenant", "ops", "--dry-run")
    assert "+ default/cloud-chat-sales" in dry and "+ default/internal-order-agent" in dry
    assert "(dry run: nothing changed)" in dry and not Agent.objects.exists()

    out = run(TWO_AGENTS, "--tenant", "ops")
    assert "2 to create" in out
    cloud = Agent.objects.get(name="cloud-chat-sales")
    internal = Agent.objects.get(name="internal-order-agent")
    assert (cloud.protocol, cloud.weight, cloud.priority, cloud.internal_only) == (
        "openai", 70, 1, False)
    assert (cloud.pool_max_connections, cloud.pool_idle_seconds) == (64, 90)
    assert (internal.protocol, internal.weight, internal.priority, internal.internal_only) == (
        "openai", 30, 2, True)
    assert sorted(c.capability_id for c in internal.capabilities.all()) == [
        "chat", "knowledge", "private-data"]
    assert [i.endpoint for i in cloud.instances.all()] == ["https://api.example.com/v1"]
    header = Credential.objects.get(agent=cloud)
    assert (header.kind, header.field_name, header.value_env) == (
        "header", "Authorization", "DOWNSTREAM_OPS__CLOUD_SALES_TOKEN")
    assert not header.secret_ciphertext  # a reference, never a secret
    cert = Credential.objects.get(agent=internal)
    assert (cert.kind, cert.value_env, cert.client_cert_path, cert.ca_file) == (
        "mtls", "DOWNSTREAM_OPS__INTERNAL_CLIENT_KEY", "/etc/agent-reach/certs/ops/client.crt",
        "/etc/agent-reach/certs/ops/ca.pem")
    assert cloud.managed and internal.managed
    # Applying it again changes nothing.
    assert "0 to create, 0 to update, 2 unchanged" in run(TWO_AGENTS, "--tenant", "ops")


def test_a_file_with_two_errors_changes_nothing_and_names_both(owner, tmp_path):
    run(TWO_AGENTS, "--tenant", "ops")
    before = {a.name: (a.weight, a.priority) for a in Agent.objects.all()}
    broken = TWO_AGENTS.read_text().replace("weight: 70", "weight: 95") \
        .replace("value_env: DOWNSTREAM_OPS__CLOUD_SALES_TOKEN", "") \
        .replace("endpoint: http://10.0.8.12:8080/v1", "endpoint: ftp://10.0.8.12/v1")
    path = tmp_path / "agents.yaml"
    path.write_text(broken)
    with pytest.raises(CommandError) as raised:
        run(path, "--tenant", "ops")
    message = str(raised.value)
    assert "agents[0].auth.value_env" in message and "agents[1].endpoint" in message
    assert "nothing changed" in message
    assert {a.name: (a.weight, a.priority) for a in Agent.objects.all()} == before


def test_a_problem_only_the_registration_finds_rolls_back_every_agent(owner, settings):
    settings.UPSTREAM_ALLOW = [a for a in settings.UPSTREAM_ALLOW if a != "api.example.com"]
    with pytest.raises(DescriptorError) as raised:
        apply(owner, parse_agents_file(TWO_AGENTS.read_text(), name="agents.yaml"))
    assert list(raised.value.problems) == ["agents[0].endpoint"]
    assert not Agent.objects.exists()  # the second, valid one was not kept either


def test_prune_removes_exactly_the_agents_no_longer_listed(owner, tmp_path):
    run(TWO_AGENTS, "--tenant", "ops")
    by_api = factories.agent(owner=owner, name="registered-by-its-team")
    other = factories.tenant()
    theirs = factories.agent(owner=other, name="cloud-chat-sales-elsewhere")
    path = tmp_path / "agents.yaml"
    text = TWO_AGENTS.read_text()
    path.write_text(text[:text.index("  - name: internal-order-agent")])
    without = run(path, "--tenant", "ops", "--dry-run")
    assert "- default/internal-order-agent" not in without  # no --prune: nothing removed
    out = run(path, "--tenant", "ops", "--prune")
    assert "- default/internal-order-agent" in out and "1 to remove" in out
    assert sorted(Agent.objects.values_list("name", flat=True)) == sorted([
        "cloud-chat-sales", by_api.name, theirs.name])


def test_the_watched_file_is_applied_once_per_change(owner, tmp_path):
    path = tmp_path / "agents.yaml"
    path.write_text(TWO_AGENTS.read_text())
    assert "2 to create" in watched_file_apply(path=path, tenant_slug="ops", prune=False)
    assert watched_file_apply(path=path, tenant_slug="ops", prune=False) is None
    path.write_text(TWO_AGENTS.read_text().replace("weight: 70", "weight: 45"))
    assert "1 to update" in watched_file_apply(path=path, tenant_slug="ops", prune=False)
    assert Agent.objects.get(name="cloud-chat-sales").weight == 45
    path.write_text("agents: [{name: x}]")
    refused = watched_file_apply(path=path, tenant_slug="ops", prune=False)
    assert refused.startswith("refused") and "agents[0]" in refused
    assert watched_file_apply(path=path, tenant_slug="ops", prune=False) is None  # once
    assert Agent.objects.get(name="cloud-chat-sales").weight == 45


def test_a_dry_run_refuses_what_apply_would_and_changes_nothing(owner, tmp_path):
    """A variable the platform does not lend is found by the models' own check: the dry
    run makes it too (and still writes nothing)."""
    path = tmp_path / "agents.yaml"
    path.write_text(TWO_AGENTS.read_text().replace("DOWNSTREAM_OPS__CLOUD_SALES_TOKEN",
                                                   "REACH_CREDENTIAL_KEYS"))
    with pytest.raises(CommandError, match=r"agents\[0\]\.auth\.value_env"):
        run(path, "--tenant", "ops", "--dry-run")
    assert "2 to create" in run(TWO_AGENTS, "--tenant", "ops", "--dry-run")
    assert not Agent.objects.exists()
