"""Agent-Reach platform: settings, URLs, the ASGI entry points and the run command."""
