"""``manage.py reach_rotate_keys``: re-encrypt every stored secret with the first key of
``REACH_CREDENTIAL_KEYS``, so an old key can then be removed (docs/production.md)."""

from __future__ import annotations

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from tasks.models import SigningSecret
from tenants.models import Credential
from tools.models import Tool

# Every model that keeps a secret encrypted, and the field that holds it.
ENCRYPTED = ((Credential, "secret_ciphertext"), (Tool, "secret_ciphertext"),
             (SigningSecret, "secret_ciphertext"))


class Command(BaseCommand):
    help = ("Re-encrypt downstream credentials, tool secrets and signing secrets with the "
            "first REACH_CREDENTIAL_KEYS key (prepend the new key first; remove the old one "
            "once this has run everywhere).")

    def handle(self, *args, **options):
        keys = list(settings.CREDENTIAL_KEYS)
        if not keys:
            raise CommandError("REACH_CREDENTIAL_KEYS holds no key.")
        fernet = MultiFernet([Fernet(k.encode()) for k in keys])
        counts = {}
        with transaction.atomic():
            for model, field in ENCRYPTED:
                done = 0
                for row in model.objects.exclude(**{f"{field}__isnull": True}).iterator():
                    token = bytes(getattr(row, field))
                    if not token:
                        continue
                    try:
                        setattr(row, field, fernet.rotate(token))
                    except InvalidToken:
                        raise CommandError(
                            f"{model._meta.label} {row.pk}: no configured key decrypts it; "
                            "nothing was changed.") from None
                    row.save(update_fields=[field])
                    done += 1
                counts[model._meta.label] = done
        self.stdout.write(", ".join(f"{label}: {n} re-encrypted" for label, n in counts.items())
                          + "\n")
