"""The models and their migrations agree: a deploy never finds an unmigrated change."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command


@pytest.mark.django_db
def test_no_model_change_lacks_its_migration():
    out = io.StringIO()
    try:
        call_command("makemigrations", "--check", "--dry-run", stdout=out, stderr=out)
    except SystemExit as exit_:
        raise AssertionError(f"models changed without a migration:\n{out.getvalue()}") from exit_
