from django.apps import AppConfig


class ToolsConfig(AppConfig):
    name = "tools"
    verbose_name = "Tool gateway"

    def ready(self) -> None:
        from tools import signals  # noqa: F401  (tools and their grants reach the route table)
