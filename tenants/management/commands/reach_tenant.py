"""``manage.py reach_tenant <slug>``: a tenant and an API key for it, from the shell.

The first tenant of a fresh production install has no key to call the REST API with;
the admin was the only way in (a break test found docs/production.md silent on it).
This creates the tenant if it does not exist and issues a key, printed once: only its
hash is stored.
"""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from tenants.choices import ApiKeyScope
from tenants.models import Tenant
from tenants.services import api_key_create


class Command(BaseCommand):
    help = ("Create a tenant (or reuse it) and issue it an API key, printed once. "
            "Scopes default to invoke, read, manage and register.")

    def add_arguments(self, parser):
        parser.add_argument("slug", help="the tenant's slug, e.g. cloud-sales")
        parser.add_argument("--name", help="its display name (a new tenant's; default: slug)")
        parser.add_argument("--key-name", default="bootstrap", help="the key's name")
        parser.add_argument("--scope", action="append", choices=ApiKeyScope.values,
                            dest="scopes", help="a scope of the key (repeat for several)")

    def handle(self, *args, slug, name, key_name, scopes, **options):
        try:
            with transaction.atomic():
                tenant, created = Tenant.objects.get_or_create(
                    slug=slug, defaults={"name": name or slug})
                if created:
                    tenant.full_clean()
                issued = api_key_create(tenant=tenant, name=key_name,
                                        scopes=scopes or list(ApiKeyScope.values))
        except ValidationError as error:
            raise CommandError("; ".join(f"{field}: {' '.join(messages)}" for field, messages
                                         in error.message_dict.items())) from None
        if not tenant.is_active:
            self.stderr.write(f"tenant {slug!r} is deactivated: its key will not work "
                              "until an operator reactivates it")
        self.stdout.write(f"tenant {tenant.slug} ({'created' if created else 'existing'})")
        self.stdout.write(f"API key ({', '.join(issued.api_key.scopes)}): {issued.plaintext}")
