"""``{% console_dashboard %}``: the operations dashboard, on the admin's index page."""

from __future__ import annotations

from django import template

from reach_platform.console import dashboard_context

register = template.Library()


@register.inclusion_tag("admin/console/dashboard.html", takes_context=True)
def console_dashboard(context):
    return dashboard_context(context["request"])


@register.filter
def percent(value) -> str:
    return "–" if value is None else f"{value:.1%}"
