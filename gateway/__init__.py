"""The data plane: an ASGI app serving ``/v1/``. It never imports Django models."""
