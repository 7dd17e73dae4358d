"""An operator's agents file: the registry for one tenant as a static file, applied by
``manage.py reach_apply`` and re-applied whenever it changes (``REACH_AGENTS_FILE``).

Formats: the field reports' ``agents:`` list (name, endpoint, protocol, capabilities,
auth with ``value_env``, pool, routing weight and priority, ``internal_only``), and the
JSON/YAML descriptor formats (one descriptor, or a list of them). Secrets are never in
the file: credentials are references to environment variables.

Applying is all or nothing: every agent is registered in one transaction, and a file
with problems changes nothing and reports every problem with its path
(``agents[1].auth.value_env``). Agents registered from a file are marked ``managed``;
``prune`` removes the tenant's managed agents the file no longer lists, never agents
their teams registered through the API.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from django.db import transaction
from django.utils import timezone

from registry.descriptors import detect_and_parse
from registry.descriptors.parse import parse_agent_entry
from registry.models import Agent, AppliedFile
from registry.services import RegistrationConflict, agent_register
from registry.spec import AgentSpec, DescriptorError
from tenants.models import Tenant

MAX_FILE_BYTES = 2 * 1024 * 1024


@dataclass
class Plan:
    """What applying a file does (or did): created, updated (with the fields that
    change), unchanged and removed agents, by ``namespace/name``."""

    create: list[str] = field(default_factory=list)
    update: dict[str, dict] = field(default_factory=dict)
    unchanged: list[str] = field(default_factory=list)
    remove: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [f"+ {name}" for name in self.create]
        for name, changes in self.update.items():
            out.append(f"~ {name}")
            out += [f"    {key}: {old!r} -> {new!r}" for key, (old, new) in changes.items()]
        out += [f"- {name}" for name in self.remove]
        out.append(f"{len(self.create)} to create, {len(self.update)} to update, "
                   f"{len(self.unchanged)} unchanged, {len(self.remove)} to remove")
        return out


def parse_agents_file(text: str, *, name: str = "") -> list[AgentSpec]:
    """The agents a file lists; raises ``DescriptorError`` naming every problem."""
    if len(text.encode()) > MAX_FILE_BYTES:
        raise DescriptorError({"": [f"the file is larger than {MAX_FILE_BYTES} bytes"]})
    try:
        data = json.loads(text) if name.endswith(".json") else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise DescriptorError({"": [f"not valid {'JSON' if name.endswith('.json') else 'YAML'}"
                                    f": {str(exc).splitlines()[0][:200]}"]}) from None
    if isinstance(data, dict) and "agents" in data:
        extra = sorted(set(data) - {"agents"})
        entries = data["agents"]
        if extra or not isinstance(entries, list):
            problems = {k: ["is not a known field (beside agents)"] for k in extra}
            if not isinstance(entries, list):
                problems["agents"] = ["must be a list of agents"]
            raise DescriptorError(problems)
        return _each(entries, "agents", lambda entry: parse_agent_entry(entry))
    if isinstance(data, list):
        return _each(data, "", detect_and_parse)
    if isinstance(data, dict):
        return _each([data], None, detect_and_parse)
    raise DescriptorError({"": ["expected an 'agents:' list, a descriptor, or a list of "
                                "descriptors"]})


def _each(entries: list, at: str | None, parse) -> list[AgentSpec]:
    specs, problems = [], {}
    for index, entry in enumerate(entries):
        where = "" if at is None else f"{at}[{index}]"
        try:
            specs.append(parse(entry))
        except DescriptorError as exc:
            for path, messages in exc.problems.items():
                problems.setdefault(_joined(where, path), []).extend(messages)
    names = [f"{s.namespace}/{s.name}".lower() for s in specs]
    for index, key in enumerate(names):
        if names.index(key) != index:
            problems.setdefault(_joined("" if at is None else f"{at}[{index}]", "name"),
                                []).append(f"{specs[index].name!r} is listed twice")
    if problems:
        raise DescriptorError(problems)
    return specs


def _joined(where: str, path: str) -> str:
    return f"{where}.{path}" if where and path else where or path or "(file)"


def plan(tenant: Tenant, specs: list[AgentSpec], *, prune: bool = False) -> Plan:
    """What ``apply`` would do, compared with the database now."""
    result = Plan()
    existing = {f"{a.namespace.name}/{a.name}": a for a in Agent.objects.filter(
        owner_tenant=tenant).select_related("namespace").prefetch_related(
        "capabilities", "instances", "credentials")}
    listed = set()
    for spec in specs:
        key = f"{spec.namespace}/{spec.name}"
        listed.add(key)
        agent = existing.get(key)
        if agent is None:
            result.create.append(key)
            continue
        changes = _changes(agent, spec)
        if changes:
            result.update[key] = changes
        else:
            result.unchanged.append(key)
    if prune:
        result.remove = sorted(k for k, a in existing.items() if a.managed and k not in listed)
    return result


def _changes(agent: Agent, spec: AgentSpec) -> dict:
    """The fields ``spec`` would change on ``agent`` (old, new)."""
    out = {}
    stated = {"description": spec.description, "protocol": spec.protocol,
              "version": spec.version, "weight": spec.weight, "priority": spec.priority,
              "internal_only": spec.internal_only,
              "pool_max_connections": spec.pool_max_connections,
              "pool_idle_seconds": spec.pool_idle_seconds}
    for name, new in stated.items():
        if new is not None and getattr(agent, name) != new:
            out[name] = (getattr(agent, name), new)
    capabilities = sorted(c.capability_id for c in agent.capabilities.all())
    wanted = sorted(c.capability_id for c in spec.capabilities)
    if capabilities != wanted:
        out["capabilities"] = (capabilities, wanted)
    endpoints = sorted(i.endpoint for i in agent.instances.all())
    if spec.endpoint and not any(e.rstrip("/") == spec.endpoint.rstrip("/") for e in endpoints):
        out["endpoint"] = (endpoints, spec.endpoint)
    if spec.credential is not None:
        have = [(c.kind, c.field_name, c.value_env) for c in agent.credentials.all()]
        want = (spec.credential.kind, spec.credential.field_name, spec.credential.value_env)
        if want not in have:
            out["credential"] = (have, want)
    if not agent.managed:
        out["managed"] = (False, True)
    return out


class _Abandon(Exception):
    pass


def apply(tenant: Tenant, specs: list[AgentSpec], *, prune: bool = False) -> Plan:
    """Register every agent of the file for ``tenant`` (all or nothing), mark them
    managed, and with ``prune`` remove the managed agents no longer listed. Raises
    ``DescriptorError`` with every problem (each agent's, path-prefixed) and changes
    nothing then. Agents that would not change are left untouched."""
    result = plan(tenant, specs, prune=prune)
    problems: dict[str, list[str]] = {}
    touched = set(result.create) | set(result.update)
    try:
        with transaction.atomic():
            for index, spec in enumerate(specs):
                key = f"{spec.namespace}/{spec.name}"
                if key not in touched:
                    continue
                try:
                    with transaction.atomic():
                        registration = agent_register(tenant=tenant, spec=spec)
                except DescriptorError as exc:
                    for path, messages in exc.problems.items():
                        problems.setdefault(f"agents[{index}].{path}", []).extend(messages)
                    continue
                except RegistrationConflict as exc:
                    problems.setdefault(f"agents[{index}].name", []).append(str(exc))
                    continue
                if not registration.agent.managed:  # not in the route table: no delta
                    Agent.objects.filter(pk=registration.agent.pk).update(managed=True)
            if problems:
                raise _Abandon
            for key in result.remove:
                namespace, name = key.split("/", 1)
                for agent in Agent.objects.filter(owner_tenant=tenant, namespace__name=namespace,
                                                  name=name, managed=True):
                    agent.delete()
    except _Abandon:
        raise DescriptorError(problems) from None
    return result


def apply_path(tenant: Tenant, path: Path, *, prune: bool = False) -> Plan:
    text = path.read_text(encoding="utf-8")
    return apply(tenant, parse_agents_file(text, name=path.name), prune=prune)


def digest_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def watched_file_apply(*, path: Path, tenant_slug: str, prune: bool) -> str | None:
    """The periodic check of ``REACH_AGENTS_FILE``: apply it when its content changed
    since it was last applied (or last refused). Returns what happened, None when
    nothing did. A refused file is reported once per content, in the log and the admin
    (``AppliedFile``), and the agents stay as the last good file left them."""
    try:
        digest = digest_of(path)
    except OSError as exc:
        return f"cannot read {path}: {exc.strerror or exc}"
    state = AppliedFile.objects.filter(path=str(path)).first()
    if state is not None and state.digest == digest:
        return None
    tenant = Tenant.objects.filter(slug=tenant_slug).first()
    if tenant is None:
        return f"no tenant {tenant_slug!r} for {path}"
    error = ""
    try:
        result = apply_path(tenant, path, prune=prune)
        outcome = "; ".join(result.lines()[-1:])
    except DescriptorError as exc:
        error = "; ".join(f"{p}: {' '.join(m)}" for p, m in exc.problems.items())[:4000]
        outcome = f"refused: {error}"
    AppliedFile.objects.update_or_create(path=str(path), defaults={
        "digest": digest, "applied_at": timezone.now(), "error": error})
    return outcome
