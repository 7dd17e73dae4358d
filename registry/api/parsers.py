from __future__ import annotations

from rest_framework.parsers import BaseParser


class YAMLTextParser(BaseParser):
    """Hands a ``capability.yaml`` body to the view as text; the descriptor parser reads it
    with ``yaml.safe_load`` and reports syntax errors with their line."""

    media_type = "application/yaml"

    def parse(self, stream, media_type=None, parser_context=None) -> str:
        raw = stream.read() if stream is not None else b""
        return raw.decode("utf-8", errors="replace")


class TextYAMLParser(YAMLTextParser):
    media_type = "text/yaml"


class XYAMLParser(YAMLTextParser):
    media_type = "application/x-yaml"
