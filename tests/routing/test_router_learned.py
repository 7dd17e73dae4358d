"""The router hands the intent matcher the requesting tenant's learned phrases, and only
those (``RouteTable.learned_by_tenant``): one tenant's feedback never steers another's."""

from __future__ import annotations

import dataclasses
import types

from routing.matcher import IntentIndex, Match
from routing.router import Router, RouteRequest, capability_texts
from routing.table import Delta, LearnedEntry
from tests.routing.tables import agent, table


class RecordingIndex(IntentIndex):
    """The real intent index, saying which learned phrases each match was given."""

    def __init__(self, routes) -> None:
        super().__init__(list(capability_texts(routes).values()))
        self.learned: list[tuple] = []

    def match(self, text: str, *, learned=(), **masks) -> Match:
        self.learned.append(tuple(learned))
        return super().match(text, learned=learned, **masks)


def test_each_tenant_is_matched_with_its_own_learned_phrases_only():
    mine = LearnedEntry(pk=1, tenant_pk=1, capability_id="translate.text", phrase="say it in fr")
    theirs = LearnedEntry(pk=2, tenant_pk=2, capability_id="translate.text", phrase="deck")
    routes = dataclasses.replace(
        table(agent("a")), learned=types.MappingProxyType({1: mine, 2: theirs})).indexed()
    index = RecordingIndex(routes)
    router = Router(index=lambda: index)
    for tenant_pk in (1, 2, 3):
        router.route(routes, RouteRequest(tenant_pk=tenant_pk, intent="anything"), pick=False)
    assert index.learned == [(mine,), (theirs,), ()]
    # A delta moves only its tenant's phrases.
    later = routes.apply(Delta(version=2, kind="learned", op="delete", pk=1))
    router.route(later, RouteRequest(tenant_pk=1, intent="anything"), pick=False)
    assert index.learned[-1] == ()
    assert later.learned_by_tenant[2] == (theirs,)
