from django.apps import AppConfig


class RegistryConfig(AppConfig):
    name = "registry"
    verbose_name = "Agent registry"

    def ready(self) -> None:
        from registry import signals  # noqa: F401  (connects the route-table publisher)
