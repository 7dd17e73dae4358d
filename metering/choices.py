from reach_core import kinds
from reach_platform.choices import django_choices

Outcome = django_choices(kinds.Outcome)
