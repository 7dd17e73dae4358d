"""Rounding for figures the gateway writes on every call (timings, costs, scores)."""

from __future__ import annotations

_SCALES = tuple(10.0 ** places for places in range(10))


def rounded(value: float, places: int) -> float:
    """``value`` to ``places`` decimals, as ``round(value, places)`` shows it.

    ``round(x, n)`` on a float converts it to decimal digits and back to round it
    correctly: some 2,500 instructions, and a call wrote a dozen such figures (2 % of
    the gateway's instructions per call). Scaling, rounding to an integer and scaling
    back prints the same figure, except where ``value`` lies within a rounding error of
    a half or a double cannot hold all the places (an epoch time to the microsecond):
    there it differs by one unit of the last place. No timing, cost or score here
    depends on that. Non-finite values are returned as they are."""
    scale = _SCALES[places]
    scaled = value * scale
    if scaled - scaled != 0.0:  # inf or nan: round() of it raises
        return value
    return round(scaled) / scale
