"""Architecture guarantees that are about imports, checked in a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.servers import ROOT

FRAMEWORKS = ("django", "rest_framework", "celery", "channels", "kombu")
PROJECT_APPS = ("reach_platform", "tenants", "registry", "metering", "audit")


def modules_loaded_by(statement: str) -> list[str]:
    code = f"{statement}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    # No DJANGO_SETTINGS_MODULE or anything else of the test run's environment.
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True, env={"PATH": "/usr/bin:/bin"}).stdout
    return json.loads(out)


def test_importing_the_gateway_and_the_router_loads_no_django_and_no_app():
    loaded = modules_loaded_by(
        "import gateway.app, gateway.pipeline, gateway.doors, gateway.protocols, "
        "routing.router, routing.subscriber, reach_core.errors")
    leaked = [m for m in loaded if m.split(".")[0] in FRAMEWORKS + PROJECT_APPS]
    assert leaked == []
    assert "gateway.pipeline" in loaded  # the statement did import something


def test_the_core_imports_nothing_else_of_the_project():
    loaded = modules_loaded_by("import reach_core.errors, reach_core.kinds, reach_core.keys, "
                               "reach_core.endpoints, reach_core.requestid")
    others = [m for m in loaded
              if m.split(".")[0] in FRAMEWORKS + PROJECT_APPS + ("gateway", "routing")]
    assert others == []


def test_the_import_contracts_hold():
    lint_imports = Path(sys.executable).parent / "lint-imports"
    result = subprocess.run([str(lint_imports), "--no-cache"], cwd=ROOT, capture_output=True,
                            text=True, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert ", 0 broken." in result.stdout


def test_every_error_code_is_an_outcome_a_call_can_be_metered_with():
    from reach_core.errors import CATALOGUE
    from reach_core.kinds import Outcome

    assert set(CATALOGUE) <= set(Outcome)
