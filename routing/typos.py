"""Chinese sound-alike slips, read as what was meant: 会议机要 -> 会议纪要, 蜜码 -> 密码.

Chinese is typed through pinyin: the writer types the sound and picks a character,
and a quick pick is often another character of the same sound. The lexicon's forms
(``routing.lexicon``) are the words a request is matched on, so a slip in one of them
costs the request its meaning. Here a span of a request that sounds like a lexicon
form (tones ignored, each typed character by its usual reading) and differs from it in
exactly one character is read as the form. One character, never a common particle
(的, 是, 了 ...), and in a two-character form the kept one must not be a common
character either: a span is "corrected" only where a single slip explains it.

The readings come from ``pypinyin``'s character table, read as data (the package's own
modules are not imported: with their phrase tables they take 50 MB).
"""

from __future__ import annotations

import importlib.util
import json
import unicodedata
from pathlib import Path

from routing.text import _CJK, CJK_STOP

_READINGS: dict[str, tuple[str, ...]] | None = None
# Characters too common to anchor a two-character correction on.
_LOOSE = frozenset(CJK_STOP) | frozenset("点上出来去看做说哪啥什怎")
_FORMS: dict[tuple[int, str], list[tuple[str, tuple[str, ...]]]] | None = None


def _toneless(syllable: str) -> str:
    return "".join(c for c in unicodedata.normalize("NFD", syllable)
                   if not unicodedata.combining(c))


def _readings() -> dict[str, tuple[str, ...]]:
    """Each CJK character's readings, toneless, the most common first (pypinyin's
    order); empty when pypinyin is not installed."""
    global _READINGS
    if _READINGS is None:
        spec = importlib.util.find_spec("pypinyin")
        table: dict[str, str] = {}
        if spec is not None and spec.submodule_search_locations:
            source = Path(next(iter(spec.submodule_search_locations))) / "pinyin_dict.json"
            if source.exists():
                table = json.loads(source.read_text(encoding="utf-8"))
        _READINGS = {chr(int(code)): tuple(dict.fromkeys(_toneless(s) for s in value.split(",")))
                     for code, value in table.items()}
    return _READINGS


def _forms() -> dict[tuple[int, str], list[tuple[str, tuple[str, ...]]]]:
    """The lexicon's CJK forms by (length, first syllable), each with its syllables."""
    global _FORMS
    if _FORMS is None:
        from routing.lexicon import CONCEPTS

        readings = _readings()
        out: dict[tuple[int, str], list[tuple[str, tuple[str, ...]]]] = {}
        for forms in CONCEPTS.values():
            for form in forms:
                if len(form) < 2 or not _CJK.fullmatch(form) or any(c not in readings
                                                                    for c in form):
                    continue
                # The intended word's own sound: each character's usual reading.
                sound = tuple(readings[c][0] for c in form)
                out.setdefault((len(form), sound[0]), []).append((form, sound))
        _FORMS = out
        _LENGTHS[:] = sorted({length for length, _ in out}, reverse=True)
        _KNOWN.update(form for group in out.values() for form, _ in group)
    return _FORMS


_LENGTHS: list[int] = []  # the forms' lengths, longest first
_KNOWN: set[str] = set()  # the forms themselves: never "corrected" into another


def heard(text: str) -> str:
    """``text`` with each one-character sound-alike slip of a lexicon form replaced by
    the form (left to right, longer forms first); unchanged when there is none."""
    readings = _readings()
    if not readings or not _CJK.search(text):
        return text
    forms = _forms()
    lengths, known = _LENGTHS, _KNOWN
    out = []
    last = 0
    for run in _CJK.finditer(text):
        chars = run.group()
        i = 0
        while i < len(chars):
            fixed = None
            for length in lengths:
                window = chars[i:i + length]
                if len(window) < length:
                    continue
                if window in known:
                    break
                fixed = _slip_of(window, forms, readings)
                if fixed is not None:
                    break
            if fixed is not None:
                start = run.start() + i
                out.append(text[last:start])
                out.append(fixed)
                last = start + len(fixed)
                i += len(fixed)
            else:
                i += 1
    if not out:
        return text
    out.append(text[last:])
    return "".join(out)


def _slip_of(window: str, forms, readings) -> str | None:
    first = readings.get(window[0])
    if not first:
        return None
    for syllable in first:
        for form, sound in forms.get((len(window), syllable), ()):
            slips = 0
            for typed, meant, heard_as in zip(window, form, sound, strict=True):
                if typed == meant:
                    if len(form) == 2 and typed in _LOOSE:
                        break  # 下预 is not 下雨: too little is left to be sure of
                    continue
                # The typed character's usual reading only: an input method offers a
                # character under its common sound, not under a rare one (说 is yue too).
                if typed in CJK_STOP or readings.get(typed, ("",))[0] != heard_as:
                    break
                slips += 1
                if slips > 1:
                    break
            else:
                if slips == 1:
                    return form
    return None
