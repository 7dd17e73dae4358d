"""Helpers shared by the test suite: servers, outages, clocks, waiting and metrics.

Nothing here touches the machine's shared PostgreSQL or Redis beyond ordinary client
traffic: outages are simulated with test-owned forwarders (``forwarder.Forwarder``).
"""
