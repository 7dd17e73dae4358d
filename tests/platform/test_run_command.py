"""The README's first command, as a new user meets it: a fresh data dir, real uvicorn."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.support.servers import free_port, platform_env, running
from tests.support.waiting import wait_for


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("run")
    port = free_port()
    log = tmp / "log"
    # Embedded mode: no DATABASE_URL, no REDIS_URL, secrets generated into the data dir.
    env = platform_env(tmp / "var")
    # What a fresh clone runs: its defaults, the sentence encoder included.
    for name in ("REACH_SECRET_KEY", "REACH_CREDENTIAL_KEYS", "REACH_INTENT_EMBEDDER"):
        env.pop(name)
    args = ["manage.py", "reach_run", "--port", str(port)]
    with running(args, env=env, port=port, log=log) as base:
        output = log.read_text()
        yield base, output, tmp / "var"


def _printed(output: str, pattern: str) -> str:
    match = re.search(pattern, output)
    assert match, output
    return match.group(1)


def test_it_prints_a_working_admin_login(first_run):
    base, output, _ = first_run
    password = _printed(output, r"admin login: admin / (\S+)")
    with httpx.Client(base_url=base) as browser:
        form = browser.get("/admin/login/")
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text).group(1)
        done = browser.post(
            "/admin/login/?next=/admin/",
            data={"username": "admin", "password": password, "csrfmiddlewaretoken": token},
            headers={"Referer": f"{base}/admin/login/"},
        )
        assert done.status_code == 302 and done.headers["location"] == "/admin/"
        console = browser.get("/admin/")
        assert console.status_code == 200 and "Operations console" in console.text
        agents = browser.get("/admin/registry/agent/")
        assert agents.status_code == 200


def test_it_prints_a_working_api_key(first_run):
    base, output, _ = first_run
    key = _printed(output, r"API key for tenant 'demo': (rk_\S+)")
    tenants = httpx.get(f"{base}/api/v1/tenants/", headers={"Authorization": f"Bearer {key}"})
    assert tenants.status_code == 200
    assert [t["slug"] for t in tenants.json()["results"]] == ["demo"]


def test_it_serves_the_api_docs_with_their_assets(first_run):
    base, _, _ = first_run
    docs = httpx.get(f"{base}/api/docs/")
    assert docs.status_code == 200
    assets = re.findall(r'(?:src|href)="(/static/[^"]+)"', docs.text)
    assert any("swagger-ui" in a for a in assets), docs.text
    for asset in assets:
        assert httpx.get(f"{base}{asset}").status_code == 200, asset
    schema = httpx.get(f"{base}/api/schema/")
    assert schema.status_code == 200 and "/api/v1/agents/" in schema.text


def test_admin_static_files_are_served(first_run):
    base, _, _ = first_run
    assert httpx.get(f"{base}/static/admin/css/base.css").status_code == 200


def test_generated_secrets_stay_private_and_out_of_the_output(first_run):
    _, output, data_dir = first_run
    for name in ("secret_key", "credential_keys"):
        path = data_dir / name
        assert path.stat().st_mode & 0o777 == 0o600
        assert path.read_text().strip() not in output


def _readme_examples() -> str:
    """Every ```bash block between the README's demo-examples markers, in order."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    part = readme[readme.index("<!-- demo-examples -->"):readme.index("<!-- /demo-examples -->")]
    return "\n".join(block.split("```", 1)[0] for block in part.split("```bash\n")[1:])


def test_the_readme_demo_examples_work_verbatim_in_order(first_run):
    base, _, data_dir = first_run
    log = data_dir.parent / "log"
    # As the README says: once the run command prints "demo ready".
    wait_for(lambda: "demo ready" in log.read_text(), timeout=60, interval=0.1,
             message="the run command to announce the demo")
    key = _printed(log.read_text(), r"API key for tenant 'demo': (rk_\S+)")
    script = _readme_examples()
    assert script.count("127.0.0.1:8000") >= 6 and "export KEY=rk_..." in script
    script = script.replace("127.0.0.1:8000", base.removeprefix("http://"))
    script = script.replace("export KEY=rk_...", f"export KEY={key}")
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", script], capture_output=True,
                            text=True, timeout=120, cwd=Path(__file__).resolve().parents[2],
                            env={**os.environ, "PATH": f"{Path(sys.executable).parent}:"
                                 + os.environ["PATH"]})
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert '"reply_content":"おはようございます"' in out  # the sidecar's legacy translator
    assert out.count("chat.completion.chunk") > 3 and "data: [DONE]" in out  # streamed
    assert '"agent":"demo-summarizer"' in out and '"key_points":[' in out  # by intent
    assert '"agent":"demo-vault"' in out and '"customer":"ACME Corp"' in out  # tunnel
    assert '"agent":"demo-stockkeeper"' in out and '"in_stock":42' in out  # a tool, by an agent
    assert '"tool":"stock-lookup"' in out and '"in_stock":7' in out  # the tool, by a key
    assert '"type":"function"' in out and '"name":"stock-lookup"' in out  # OpenAI tools
    assert "mcp tools: True True" in out and '"in_stock":1250' in out  # an MCP session
    assert "You said: Hi!" in out  # openai SDK, demo-chat
    assert "You said: Tell me a story" in out  # openai SDK, streamed from demo-assistant
    assert "demo-phrasebook {'translation': 'merci'" in out  # ReachClient.invoke
    assert "You said: hello" in out  # ReachClient.stream
    assert "no agent for that: no_capability" in out  # typed errors
    assert "input-required - Which period" in out  # the async task asks ...
    assert "completed {" in out and "'total_sales': 12840.5" in out  # ... and finishes


def test_calls_are_metered_into_the_database_in_embedded_mode(first_run):
    base, output, _ = first_run
    key = _printed(output, r"API key for tenant 'demo': (rk_\S+)")
    headers = {"Authorization": f"Bearer {key}"}
    reply = httpx.post(f"{base}/v1/invoke", headers=headers, json={
        "capability": "translate.text", "input": {"text": "thank you", "dest_lang": "ja"}})
    request_id = reply.json()["request_id"]

    def metered() -> httpx.Response | None:
        found = httpx.get(f"{base}/api/v1/usage/events/{request_id}/", headers=headers)
        return found if found.status_code == 200 else None

    # The in-process scheduler drains the gateway's usage queue every second.
    event = wait_for(metered, timeout=15, interval=0.2, message="the call to be metered").json()
    assert event["outcome"] == "success" and event["tenant"] == "demo"


def test_the_run_port_is_one_of_the_platforms_own_ports(first_run):
    """An agent pointing back at the port the run command serves on is refused."""
    base, output, _ = first_run
    key = _printed(output, r"API key for tenant 'demo': (rk_\S+)")
    port = int(base.rsplit(":", 1)[1])
    body = json.loads((Path(__file__).resolve().parents[1] / "registry" / "examples"
                       / "translator.json").read_text())
    body["agent_id"] = "loop-back"
    body["reach"]["endpoint"] = f"http://127.0.0.1:{port}/"
    response = httpx.post(f"{base}/api/v1/agents/register", json=body,
                          headers={"Authorization": f"Bearer {key}"})
    assert response.status_code == 400, response.text
    assert "reach.endpoint" in response.json()["error"]["details"]


def test_claim_own_port_joins_the_setting(settings, monkeypatch):
    from reach_core.endpoints import EndpointRefused, check_registration
    from reach_platform.endpoints import endpoint_policy
    from reach_platform.management.commands.reach_run import claim_own_port

    monkeypatch.setenv("REACH_OWN_PORTS", "8000")
    settings.OWN_PORTS = [8000]
    check_registration("http://127.0.0.1:8765/", endpoint_policy())  # allowed before
    assert claim_own_port(8765) == [8000, 8765]
    assert claim_own_port(8765) == [8000, 8765]  # once
    assert os.environ["REACH_OWN_PORTS"] == "8000,8765"
    with pytest.raises(EndpointRefused):
        check_registration("http://127.0.0.1:8765/", endpoint_policy())


def test_a_request_for_another_host_writes_no_traceback_to_the_log(first_run):
    """helper-53: each request naming a Host the platform does not serve wrote Django's
    DisallowedHost traceback (about 40 lines) to the output, though its logger had no
    handler: logging's last resort printed it. The request still gets its JSON 400."""
    base, _, data_dir = first_run
    log = data_dir.parent / "log"
    reply = httpx.get(f"{base}/api/v1/agents/", headers={"Host": "evil.example"})
    assert reply.status_code == 400, reply.text
    request_id = reply.headers["x-request-id"]
    # The access line comes after the request's own lines: once it is in, they are too.
    wait_for(lambda: request_id in log.read_text(), timeout=10, interval=0.05,
             message="the request's access line")
    output = log.read_text()
    assert "Traceback" not in output and "Invalid HTTP_HOST" not in output
