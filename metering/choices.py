from reach_core import kinds
from reach_platform.choices import django_choices

Outcome = django_choices(kinds.Outcome)

# What "errors" counts and splits by: every outcome but success, in the catalogue's order
# (so client_cancelled, which is the caller's doing, is a reason of its own).
ERROR_REASONS: tuple[str, ...] = tuple(
    value for value in Outcome.values if value != Outcome.SUCCESS
)


def sorted_reasons(counts: dict[str, int]) -> dict[str, int]:
    """``counts`` without zeros, in ``ERROR_REASONS`` order (unknown names last, sorted)."""
    order = {reason: index for index, reason in enumerate(ERROR_REASONS)}
    return {
        reason: counts[reason]
        for reason in sorted(counts, key=lambda r: (order.get(r, len(order)), r))
        if counts[reason]
    }
