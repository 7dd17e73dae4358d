from django.apps import AppConfig


class ReachPlatformConfig(AppConfig):
    name = "reach_platform"
    verbose_name = "Agent-Reach platform"

    def ready(self) -> None:
        # Tasks defined with @shared_task bind to this app once it is imported. Here rather
        # than in the package's __init__: a gateway process (reach_platform.gateway_asgi)
        # imports the package without installing the app, and needs no Celery at all.
        from reach_platform import celery  # noqa: F401
