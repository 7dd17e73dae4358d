"""Two registrations racing for one name against a real server on PostgreSQL: the loser gets
the answer it would get had it come second (200 update, 409 another tenant's name, 400 a
name differing only in case), never a 500 from the unique index."""

from __future__ import annotations

import json
import threading
from collections import Counter
from pathlib import Path

import httpx
import pytest
from django.conf import settings

from registry.models import Agent
from tenants.choices import ApiKeyScope
from tests import factories
from tests.support.servers import free_port, platform_env, running, uvicorn_args

pytestmark = pytest.mark.skipif(
    not settings.DATABASES["default"]["ENGINE"].endswith("postgresql"),
    reason="needs PostgreSQL: concurrent transactions against the unique indexes",
)

EXAMPLES = Path(__file__).parent / "examples"
ROUNDS = 15
# (second name's spelling, second registrant is the other tenant) -> what the loser gets.
CASES = {
    ("same", False): 200,
    ("same", True): 409,
    ("upper", False): 400,
    ("upper", True): 400,
}


def _descriptor(name: str) -> bytes:
    body = json.loads((EXAMPLES / "translator.json").read_text())
    body["agent_id"] = name
    body["reach"]["endpoint"] = "http://127.0.0.1:9301/"
    return json.dumps(body).encode()


def _database_url() -> str:
    db = settings.DATABASES["default"]
    return f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"


def test_racing_registrations_never_get_a_500(transactional_db, tmp_path):
    factories.seed_defaults()
    keys = [factories.api_key(tenant=factories.tenant(), scopes=[ApiKeyScope.REGISTER]).plaintext
            for _ in range(2)]
    env = platform_env(tmp_path, DATABASE_URL=_database_url(),
                       REACH_CREDENTIAL_KEYS=",".join(settings.CREDENTIAL_KEYS))
    port = free_port()
    outcomes: dict[tuple[str, bool], list[tuple[int, ...]]] = {case: [] for case in CASES}
    with running(uvicorn_args(port), env=env, port=port, log=tmp_path / "log") as base:
        clients = [httpx.Client(base_url=base, timeout=30) for _ in range(2)]
        try:
            for client in clients:  # connections open before the first round
                assert client.get("/healthz").status_code == 200
            for round_no in range(ROUNDS):
                for (spelling, other_tenant), _ in CASES.items():
                    name = f"race-{round_no}-{spelling}-{int(other_tenant)}"
                    names = [name, name.upper() if spelling == "upper" else name]
                    tokens = [keys[0], keys[1] if other_tenant else keys[0]]
                    barrier = threading.Barrier(2)
                    answers: list[httpx.Response | BaseException | None] = [None, None]

                    def register(i: int, names=names, tokens=tokens, barrier=barrier,
                                 answers=answers) -> None:
                        body = _descriptor(names[i])
                        headers = {"Authorization": f"Bearer {tokens[i]}",
                                   "Content-Type": "application/json"}
                        barrier.wait(timeout=30)
                        try:
                            answers[i] = clients[i].post("/api/v1/agents/register",
                                                         content=body, headers=headers)
                        except BaseException as exc:  # reported below, not lost in a thread
                            answers[i] = exc

                    threads = [threading.Thread(target=register, args=(i,)) for i in range(2)]
                    for thread in threads:
                        thread.start()
                    for thread in threads:
                        thread.join(timeout=60)
                    for answer in answers:
                        if not isinstance(answer, httpx.Response):
                            raise AssertionError(f"a registration did not answer: {answer!r}")
                    statuses = tuple(sorted(a.status_code for a in answers))
                    outcomes[(spelling, other_tenant)].append(statuses)
                    assert Agent.objects.filter(name__iexact=name).count() == 1
        finally:
            for client in clients:
                client.close()
    tally = {case: Counter(seen) for case, seen in outcomes.items()}
    # Exactly one wins (201); the other gets what a later registration would get.
    assert tally == {case: Counter({tuple(sorted((201, loser))): ROUNDS})
                     for case, loser in CASES.items()}
