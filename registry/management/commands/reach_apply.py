"""``manage.py reach_apply agents.yaml --tenant <slug> [--dry-run] [--prune]``: apply an
operator's agents file (``registry.agents_file``)."""

from __future__ import annotations

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from registry.agents_file import apply, parse_agents_file, plan
from registry.spec import DescriptorError
from tenants.models import Tenant


class Command(BaseCommand):
    help = ("Apply an agents file (the field reports' agents: list, or JSON/YAML "
            "descriptors) for one tenant: shows the changes, then makes them.")

    def add_arguments(self, parser):
        parser.add_argument("path", type=Path)
        parser.add_argument("--tenant", required=True, help="The owner tenant's slug.")
        parser.add_argument("--dry-run", action="store_true",
                            help="Show what would change; change nothing.")
        parser.add_argument("--prune", action="store_true",
                            help="Also remove the agents applied from a file earlier that "
                                 "this file no longer lists.")

    def handle(self, *args, path: Path, tenant: str, dry_run: bool, prune: bool, **options):
        owner = Tenant.objects.filter(slug=tenant).first()
        if owner is None:
            raise CommandError(f"No tenant {tenant!r}.")
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise CommandError(f"Cannot read {path}: {exc.strerror or exc}") from None
        try:
            specs = parse_agents_file(text, name=path.name)
            if dry_run:
                result = plan(owner, specs, prune=prune)
                # Every check a real apply makes (the models' own: names, lent
                # variables, ...), then rolled back: a dry run refuses what apply would.
                with transaction.atomic():
                    apply(owner, specs, prune=prune)
                    transaction.set_rollback(True)
            else:
                result = apply(owner, specs, prune=prune)
        except DescriptorError as exc:
            lines = [f"  {p}: {' '.join(m)}" for p, m in exc.problems.items()]
            raise CommandError(f"{path} was not applied ({len(lines)} problem"
                               f"{'s' if len(lines) != 1 else ''}; nothing changed):\n"
                               + "\n".join(lines)) from None
        self.stdout.write("\n".join(result.lines()) + "\n")
        if dry_run:
            self.stdout.write("(dry run: nothing changed)\n")
