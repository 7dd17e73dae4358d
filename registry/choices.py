from reach_core import kinds
from reach_platform.choices import django_choices

Protocol = django_choices(kinds.Protocol)
CapabilityKind = django_choices(kinds.CapabilityKind)
ReachMode = django_choices(kinds.ReachMode)
InstanceState = django_choices(kinds.InstanceState)
HealthTier = django_choices(kinds.HealthTier)
Visibility = django_choices(kinds.Visibility)
FeedbackSource = django_choices(kinds.FeedbackSource)
