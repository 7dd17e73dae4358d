"""Route feedback in the control plane: stored once, folded into per-tenant learned
phrases, shipped to the route table per tenant, listed and switched off in the admin."""

from __future__ import annotations

import time
import uuid

import orjson
import pytest
import redis
from django.conf import settings
from django.urls import reverse

from gateway.usage import UsageQueue
from registry import learning
from registry.learning import (
    STREAM,
    learned_phrases_set_active,
    phrase_normalise,
    route_feedback_consume,
    route_feedback_learn,
    route_feedback_queue_drain,
    route_feedback_store,
)
from registry.models import LearnedPhrase, RouteFeedback
from registry.snapshot import build_table
from routing.subscriber import RouteTableSubscriber
from routing.table import LearnedEntry


def event(tenant, intent: str, capability: str, *, routed_to: str = "",
          source: str = "explicit", **kw) -> dict:
    return {"event_id": uuid.uuid4().hex, "request_id": "req-1", "tenant": tenant.pk,
            "intent": intent, "capability": capability, "routed_to": routed_to,
            "source": source, "occurred_at": time.time(), **kw}


def learn(capture) -> dict:
    with capture(execute=True):
        return route_feedback_learn()


def phrases(table, tenant) -> set[tuple[str, str]]:
    return {(e.capability_id, e.phrase) for e in table.learned_by_tenant.get(tenant.pk, ())}


@pytest.mark.django_db
def test_events_are_stored_once_and_malformed_ones_are_skipped(world):
    good = event(world.tenant_a, "numbers for the board", "report.build")
    bad = [
        event(world.tenant_a, "nul\x00inside", "report.build"),
        event(world.tenant_a, "", "report.build"),
        event(world.tenant_a, "x" * 1001, "report.build"),
        event(world.tenant_a, "fine", "report.build", source="guessed"),
        event(world.tenant_a, "fine", "report.build", occurred_at="yesterday"),
        {**event(world.tenant_a, "fine", "report.build"), "tenant": 10**9},  # unknown
        "not an object",
    ]
    assert route_feedback_store([good, good, *bad]) == 1
    assert route_feedback_store([good]) == 0  # delivered again: a no-op
    row = RouteFeedback.objects.get()
    assert (row.tenant, row.intent, row.capability_id, row.routed_to, row.source) == (
        world.tenant_a, "numbers for the board", "report.build", "", "explicit")
    assert row.learned_at is None and row.is_miss


def test_phrases_are_normalised():
    assert phrase_normalise("  Quarterly   NUMBERS for the Board!! ") == \
        "quarterly numbers for the board"
    assert phrase_normalise("把这段话翻译成法语。") == "把这段话翻译成法语"
    assert phrase_normalise("ＦＵＬＬ　width?") == "full width"
    assert phrase_normalise(" ?! ") == ""
    # Format characters go: a right-to-left override showed the phrase reversed.
    assert phrase_normalise("\u202egist of\u200b memo\u2066") == "gist of memo"


@pytest.mark.django_db
def test_an_explicit_miss_is_learned_for_its_tenant_only(
        world, published, django_capture_on_commit_callbacks):
    subscriber = RouteTableSubscriber(loader=build_table)
    subscriber.start()
    route_feedback_store([
        event(world.tenant_a, "Quarterly numbers for the board!", "report.build",
              routed_to="summarize.text"),
        # B once, inferred: not enough support to steer B's routing, and never A's.
        event(world.tenant_b, "quarterly numbers for the board", "chat.general",
              source="inferred"),
    ])
    counts = learn(django_capture_on_commit_callbacks)
    assert counts["feedback"] == 2 and counts["phrases"] == 2 and counts["published"] == 1

    fresh = build_table()
    assert phrases(fresh, world.tenant_a) == {("report.build",
                                               "quarterly numbers for the board")}
    assert world.tenant_b.pk not in fresh.learned_by_tenant
    [entry] = fresh.learned_by_tenant[world.tenant_a.pk]
    assert isinstance(entry, LearnedEntry) and entry.tenant_pk == world.tenant_a.pk
    # The gateways get it as a delta: applied in order, it equals a fresh build.
    assert [m["pk"] for m in published if m.get("kind") == "learned"] == [entry.pk]
    for message in published:
        subscriber.handle(message)
    assert subscriber.reloads == 1 and subscriber.table == fresh
    assert subscriber.table.learned_by_tenant == fresh.learned_by_tenant
    # The resolution of each miss is recorded for the admin.
    a, b = (RouteFeedback.objects.get(tenant=t) for t in (world.tenant_a, world.tenant_b))
    assert a.learned.routable and a.learned.explicit_support == 1
    assert b.learned is not None and not b.learned.routable
    assert a.learned_at is not None and b.learned_at is not None



@pytest.mark.django_db
def test_feedback_that_says_nothing_teaches_nothing(world, django_capture_on_commit_callbacks):
    """Break test (helper-43): one report of "帮我" made a phrase that drew "help me" and
    other requests near it in meaning to its capability; its re-test (helper-45) taught
    with "go" and "查一下", generic actions that name nothing to act on. Filler is marked
    learned (it is done with) and makes no phrase; a report that says something still
    does."""
    said_nothing = ("帮我", "Help me!", "ok", "嗯 然后", "the", "go", "Run it", "查一下", "执行",
                    "go ahead", "whatever", "随便", "帮忙看一下", "another one", "Ж")
    route_feedback_store([event(world.tenant_a, text, "report.build") for text in said_nothing]
                         + [event(world.tenant_a, "numbers for the board", "report.build")])
    counts = learn(django_capture_on_commit_callbacks)
    assert counts["feedback"] == len(said_nothing) + 1 and counts["phrases"] == 1
    assert list(LearnedPhrase.objects.values_list("phrase", flat=True)) == [
        "numbers for the board"]
    assert not RouteFeedback.objects.filter(learned_at__isnull=True).exists()

@pytest.mark.django_db
def test_an_inferred_phrase_needs_two_reports(world, django_capture_on_commit_callbacks):
    route_feedback_store([event(world.tenant_a, "deck for monday", "slides.make",
                                source="inferred")])
    learn(django_capture_on_commit_callbacks)
    assert not build_table().learned_by_tenant
    route_feedback_store([event(world.tenant_a, "Deck for Monday.", "slides.make",
                                source="inferred", routed_to="report.build")])
    learn(django_capture_on_commit_callbacks)
    assert phrases(build_table(), world.tenant_a) == {("slides.make", "deck for monday")}
    assert LearnedPhrase.objects.get().support == 2


@pytest.mark.django_db
def test_confirmations_teach_nothing(world, django_capture_on_commit_callbacks):
    route_feedback_store([event(world.tenant_a, "translate this", "translate.text",
                                routed_to="translate.text")])
    assert learn(django_capture_on_commit_callbacks)["phrases"] == 0
    row = RouteFeedback.objects.get()
    assert row.learned_at is not None and row.learned is None and not row.is_miss
    assert not LearnedPhrase.objects.exists()


@pytest.mark.django_db
def test_a_phrase_pulls_towards_its_best_supported_capability_only(
        world, django_capture_on_commit_callbacks):
    route_feedback_store([event(world.tenant_a, "numbers please", "report.build")])
    learn(django_capture_on_commit_callbacks)
    assert phrases(build_table(), world.tenant_a) == {("report.build", "numbers please")}
    route_feedback_store([event(world.tenant_a, "numbers please", "sql.query")
                          for _ in range(2)])
    learn(django_capture_on_commit_callbacks)
    assert phrases(build_table(), world.tenant_a) == {("sql.query", "numbers please")}


@pytest.mark.django_db
def test_phrases_per_capability_are_capped_keeping_the_best_supported(
        world, monkeypatch, django_capture_on_commit_callbacks):
    monkeypatch.setattr(learning, "MAX_PHRASES_PER_CAPABILITY", 2)
    route_feedback_store([event(world.tenant_a, f"phrase {n}", "report.build")
                          for n in (1, 2, 2, 3, 3, 3)])
    learn(django_capture_on_commit_callbacks)
    assert phrases(build_table(), world.tenant_a) == {("report.build", "phrase 3"),
                                                      ("report.build", "phrase 2")}


@pytest.mark.django_db
def test_deactivating_a_phrase_takes_it_out_and_lets_the_next_in(
        world, monkeypatch, published, django_capture_on_commit_callbacks):
    monkeypatch.setattr(learning, "MAX_PHRASES_PER_CAPABILITY", 1)
    route_feedback_store([event(world.tenant_a, f"phrase {n}", "report.build")
                          for n in (1, 2, 2)])
    learn(django_capture_on_commit_callbacks)
    best = LearnedPhrase.objects.get(phrase="phrase 2")
    with django_capture_on_commit_callbacks(execute=True):
        assert learned_phrases_set_active(phrases=[best], active=False) == 1
    assert phrases(build_table(), world.tenant_a) == {("report.build", "phrase 1")}
    ops = [(m["op"], m["pk"]) for m in published if m.get("kind") == "learned"][-2:]
    assert sorted(ops) == sorted([("delete", best.pk), (
        "upsert", LearnedPhrase.objects.get(phrase="phrase 1").pk)])
    # Deactivated phrases stay out whatever support they gather.
    route_feedback_store([event(world.tenant_a, "phrase 2", "report.build")])
    learn(django_capture_on_commit_callbacks)
    assert phrases(build_table(), world.tenant_a) == {("report.build", "phrase 1")}


@pytest.mark.django_db
def test_the_embedded_queue_is_drained_into_rows(world):
    queue = UsageQueue()
    queue.emit(event(world.tenant_a, "from the queue", "report.build"))
    assert route_feedback_queue_drain(queue) == 1
    assert len(queue) == 0 and RouteFeedback.objects.get().intent == "from the queue"


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(not settings.REDIS_URL, reason="needs Redis (.ci/run sets REDIS_URL)")
def test_the_stream_is_consumed_once_and_emptied(world):
    client = redis.Redis.from_url(settings.REDIS_URL)
    batch = [event(world.tenant_a, f"streamed {n}", "report.build") for n in range(3)]
    client.xadd(STREAM(), {"b": orjson.dumps(batch[:2])})
    client.xadd(STREAM(), {"b": orjson.dumps(batch[1:])})  # one re-delivered
    client.xadd(STREAM(), {"b": b"not json"})
    assert route_feedback_consume(client=client, consumer="test") == 3
    assert route_feedback_consume(client=client, consumer="test") == 0
    assert client.xlen(STREAM()) == 0
    assert RouteFeedback.objects.filter(tenant=world.tenant_a).count() == 3


def test_celery_beat_and_the_embedded_scheduler_run_the_learning_jobs():
    from reach_platform.celery import app
    from reach_platform.scheduler import learning_jobs

    app.loader.import_default_modules()
    scheduled = {entry["task"] for entry in app.conf.beat_schedule.values()}
    assert {"registry.consume_route_feedback", "registry.learn_routes"} <= scheduled
    assert scheduled <= set(app.tasks)
    assert set(learning_jobs(UsageQueue())) == {"registry.drain_route_feedback",
                                                "registry.learn_routes"}


@pytest.mark.django_db
def test_the_admin_lists_misses_with_their_resolution(
        world, client, django_capture_on_commit_callbacks):
    route_feedback_store([
        event(world.tenant_a, "numbers for the board", "report.build",
              routed_to="summarize.text"),
        event(world.tenant_a, "a confirmation", "report.build", routed_to="report.build"),
        event(world.tenant_b, "beta's own miss", "report.build"),
        event(world.tenant_a, "\u202eomem fo tsig\u200b", "report.build"),
    ])
    learn(django_capture_on_commit_callbacks)
    client.force_login(world.owner)
    page = client.get(reverse("admin:registry_routefeedback_changelist")).content.decode()
    # helper-37: format characters are named, not obeyed (the line read reversed).
    assert "\u202e" not in page and "\u200b" not in page
    assert "&lt;U+202E&gt;omem fo tsig&lt;U+200B&gt;" in page
    assert "numbers for the board" in page and "summarize.text" in page
    assert "routing" in page  # the resolution: a routable learned phrase
    assert "a confirmation" not in page  # not a miss
    assert "beta&#x27;s own miss" not in page and "beta's own miss" not in page
    listing = client.get(reverse("admin:registry_learnedphrase_changelist"))
    assert listing.status_code == 200 and "numbers for the board" in listing.content.decode()

    phrase = LearnedPhrase.objects.get(tenant=world.tenant_a, phrase="numbers for the board")
    LearnedPhrase.objects.filter(tenant=world.tenant_a).exclude(pk=phrase.pk).delete()
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(reverse("admin:registry_learnedphrase_changelist"), {
            "action": "deactivate", "_selected_action": [phrase.pk]})
    assert response.status_code == 302
    phrase.refresh_from_db()
    assert not phrase.active and not phrase.routable
    assert world.tenant_a.pk not in build_table().learned_by_tenant
    # An outsider cannot switch A's phrases back on.
    client.force_login(world.outsider)
    client.post(reverse("admin:registry_learnedphrase_changelist"), {
        "action": "reactivate", "_selected_action": [phrase.pk]})
    phrase.refresh_from_db()
    assert not phrase.active
