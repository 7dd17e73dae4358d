"""drf-spectacular's hook that adds the gateway's doors (``gateway.openapi``) to the
control plane's generated document: one ``/api/schema/`` for the whole platform."""

from __future__ import annotations

from gateway.openapi import merge_into


def add_gateway(result, generator, request, public):
    return merge_into(result)
