"""The router hands the intent matcher the requesting tenant's learned phrases, and only
those (``RouteTable.learned_by_tenant``): one tenant's feedback never steers another's."""

from __future__ import annotations

import dataclasses
import types

from routing.matcher import Match, Score
from routing.router import Router, RouteRequest
from routing.table import Delta, LearnedEntry
from tests.routing.tables import agent, table


class RecordingIndex:
    """An intent index that says what it was asked, and ranks one capability."""

    def __init__(self) -> None:
        self.learned: list[tuple] = []

    def match(self, text: str, *, learned=()) -> Match:
        self.learned.append(tuple(learned))
        return Match(ranked=(Score("translate.text", 0.9, 0.9),))


def test_each_tenant_is_matched_with_its_own_learned_phrases_only():
    mine = LearnedEntry(pk=1, tenant_pk=1, capability_id="translate.text", phrase="say it in fr")
    theirs = LearnedEntry(pk=2, tenant_pk=2, capability_id="translate.text", phrase="deck")
    routes = dataclasses.replace(
        table(agent("a")), learned=types.MappingProxyType({1: mine, 2: theirs})).indexed()
    index = RecordingIndex()
    router = Router(index=lambda: index)
    for tenant_pk in (1, 2, 3):
        router.route(routes, RouteRequest(tenant_pk=tenant_pk, intent="anything"), pick=False)
    assert index.learned == [(mine,), (theirs,), ()]
    # A delta moves only its tenant's phrases.
    later = routes.apply(Delta(version=2, kind="learned", op="delete", pk=1))
    router.route(later, RouteRequest(tenant_pk=1, intent="anything"), pick=False)
    assert index.learned[-1] == ()
    assert later.learned_by_tenant[2] == (theirs,)
