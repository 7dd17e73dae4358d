"""Test settings: the in-process defaults made explicit, real services when the env names them.

``.ci/run`` sets ``DATABASE_URL`` and ``REDIS_URL`` to the machine's PostgreSQL
and Redis; without them the suite runs on SQLite and in-process parts.
"""

import os
import tempfile
import uuid

from cryptography.fernet import Fernet

os.environ.setdefault("REACH_DATA_DIR", tempfile.mkdtemp(prefix="reach-test-"))
os.environ.setdefault("REACH_SECRET_KEY", "test-only-" + uuid.uuid4().hex)
os.environ.setdefault("REACH_CREDENTIAL_KEYS", Fernet.generate_key().decode())
# Every run writes under its own Redis prefix, so runs never see each other's keys.
os.environ.setdefault("REACH_REDIS_KEY_PREFIX", f"reach-test-{uuid.uuid4().hex[:8]}:")

from reach_platform.settings import *  # noqa: F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# A file, not SQLite's in-memory default, so a real server started by a test
# (uvicorn in a subprocess) reads the same test database.
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):  # noqa: F405
    DATABASES["default"]["TEST"] = {"NAME": str(DATA_DIR / "test.sqlite3")}  # noqa: F405
LOGGING["root"]["level"] = "WARNING"  # noqa: F405
# Words only in-process: the sentence encoder costs 2 s and 80 MB per process. Tests of
# intent routing turn it on themselves (tests/routing, tests/gateway/test_intent_*).
INTENT_EMBEDDER = os.environ.get("REACH_INTENT_EMBEDDER", "lexical")
