"""Agent-Reach platform: settings, URLs, the ASGI entry point and the run command."""
