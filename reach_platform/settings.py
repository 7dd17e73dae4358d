"""Settings for Agent-Reach.

Nothing set in the environment means the embedded default: SQLite, in-process
bus, in-process limits and scheduler. ``DATABASE_URL`` and ``REDIS_URL`` switch
to PostgreSQL and Redis. Every value is read through django-environ, which raises
``ImproperlyConfigured`` on a malformed value instead of guessing.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path

import environ
from django.core.exceptions import ImproperlyConfigured

from reach_platform.envsecrets import fernet_key, secret_from_env_or_file, token_urlsafe_50

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()

DATA_DIR = Path(env.str("REACH_DATA_DIR", default=str(BASE_DIR / "var"))).resolve()

DEBUG = env.bool("REACH_DEBUG", default=False)

SECRET_KEY = secret_from_env_or_file(
    env_name="REACH_SECRET_KEY", path=DATA_DIR / "secret_key", generate=token_urlsafe_50
)

# Fernet keys for downstream credentials, comma separated: the first encrypts,
# all decrypt, so a key can be rotated without re-encrypting at once.
CREDENTIAL_KEYS = [
    k.strip()
    for k in secret_from_env_or_file(
        env_name="REACH_CREDENTIAL_KEYS", path=DATA_DIR / "credential_keys", generate=fernet_key
    ).split(",")
    if k.strip()
]
# The gateway's environment variables a tenant's credential or tool may name in
# value_env (glob patterns; reach_core.envrefs): the platform's own are never lent.
CREDENTIAL_ENV = env.list("REACH_CREDENTIAL_ENV", default=["DOWNSTREAM_{tenant}__*"])
# The directory mTLS certificate, key and CA files of tenants' credentials and tools
# must lie in (reach_core.filerefs); {tenant}: the owning tenant's slug, so that by
# default each tenant has a directory of its own; empty: none may be named.
CREDENTIAL_FILES = env.str("REACH_CREDENTIAL_FILES",
                           default="/etc/agent-reach/certs/{tenant}")

ALLOWED_HOSTS = env.list("REACH_ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "[::1]"])
CSRF_TRUSTED_ORIGINS = env.list("REACH_CSRF_TRUSTED_ORIGINS", default=[])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "reach_platform",
    "tenants",
    "registry",
    "metering",
    "audit",
    "tasks",
    "tools",
]

MIDDLEWARE = [
    "reach_platform.middleware.RequestIdMiddleware",
    # Database away -> 503 service_unavailable with Retry-After (API and admin alike).
    "reach_platform.middleware.DatabaseUnavailableMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "reach_platform.urls"
# Never redirect an API call to add a slash: the redirect would drop a POST body.
APPEND_SLASH = False

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

WSGI_APPLICATION = None
ASGI_APPLICATION = "reach_platform.asgi.application"

DATABASES = {
    "default": env.db_url(
        "DATABASE_URL", default=f"sqlite:///{DATA_DIR / 'reach.sqlite3'}"
    )
}
if DATABASES["default"]["ENGINE"].endswith("postgresql"):
    # Under ASGI, sync views run on executor threads, so Django's per-thread
    # persistent connections would pile up; psycopg's pool is shared by the
    # process instead. A readiness probe must answer quickly when PostgreSQL is
    # away, hence the short connect timeout. Checking a connection as it leaves
    # the pool costs one round trip and means a PostgreSQL restart costs nothing
    # more than reconnecting.
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True  # Django's switch for the pool's check
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {
            "connect_timeout": env.int("REACH_DB_CONNECT_TIMEOUT", default=3),
            "pool": {
                "min_size": 1,
                "max_size": env.int("REACH_DB_POOL_SIZE", default=8),
                # How long a request waits for a pooled connection: with PostgreSQL away
                # it gets its 503 service_unavailable after this long, not a hang.
                "timeout": env.float("REACH_DB_POOL_TIMEOUT", default=1.0),
                # How long the pool keeps retrying one failed connection attempt before it
                # gives up on it. Its retries back off exponentially (1 s, 2 s, 4 s, ...)
                # and, while one is pending, no request starts another: with the default
                # 300 s, an 8 s outage kept the API at 503 for ~7 s after PostgreSQL was
                # back, a longer one for longer still. Giving up after 1 s lets the next
                # waiting request start a new attempt at once, so the API is back within
                # about a second of PostgreSQL (tests/platform/test_degraded.py).
                "reconnect_timeout": 1.0,
            },
            # A partition (sent data never acknowledged) fails the query after 5 s rather
            # than the kernel's ~15 min; keepalives find a dead idle connection. A peer
            # that acknowledges but never answers (a frozen server) is not bounded here.
            "tcp_user_timeout": env.int("REACH_DB_TCP_USER_TIMEOUT_MS", default=5000),
            "keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 3,
            "keepalives_count": 3,
        }
    )
elif DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # The embedded default: heartbeats, the scheduler's jobs and requests write from
    # several threads. WAL lets readers run beside the writer, and IMMEDIATE takes the
    # write lock at BEGIN, so two writers queue (up to ``timeout`` s) instead of one
    # failing at once with "database is locked" when it upgrades a read lock.
    DATABASES["default"].setdefault("OPTIONS", {}).update({
        "transaction_mode": "IMMEDIATE", "timeout": 20,
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    })

# Retry-After (seconds) on the 503 answered while the database is unreachable.
DB_UNAVAILABLE_RETRY_AFTER = env.int("REACH_DB_UNAVAILABLE_RETRY_AFTER", default=2)

REDIS_URL = env.str("REDIS_URL", default="") or None

if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            # A receive blocks on Redis for up to 5 s (channels-redis' BZPOPMIN): the
            # socket must wait longer, or every idle receive ends in a TimeoutError.
            "CONFIG": {"hosts": [{"address": REDIS_URL, "socket_timeout": 15,
                                  "socket_connect_timeout": 2}]},
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# Prefix for every Redis key the platform writes, so several deployments (or test
# runs) can share one Redis server.
REDIS_KEY_PREFIX = env.str("REACH_REDIS_KEY_PREFIX", default="reach:")
# How long a gateway waits on one Redis command (and for a pooled connection) before it
# takes Redis for hung and keeps its limits, budgets and idempotency without it for a
# while (gateway/redis_gate.py). Longer on machines whose CPU is often saturated: there
# a late event loop makes a working Redis look hung.
REDIS_TIMEOUT_S = env.float("REACH_REDIS_TIMEOUT_S", default=1.0)

# ---- asynchronous tasks (tasks/, gateway/tasks.py) ------------------------------------
# How long a task may take from submission to a final state, whoever holds it meanwhile.
TASK_DEADLINE_S = env.int("REACH_TASK_DEADLINE_S", default=3600)
# A worker's claim on a running task lasts this long unless renewed (every third of it);
# a task whose worker died is run again this long after, at most TASK_MAX_ATTEMPTS times.
TASK_LEASE_S = env.float("REACH_TASK_LEASE_S", default=15.0)
TASK_MAX_ATTEMPTS = env.int("REACH_TASK_MAX_ATTEMPTS", default=5)
# Tasks one worker process runs at once (0: this process runs none).
TASK_CONCURRENCY = env.int("REACH_TASK_CONCURRENCY", default=64)
# Callback deliveries: 1 s, 2 s, 4 s, ... between attempts (with jitter), this many retries.
CALLBACK_RETRIES = env.int("REACH_CALLBACK_RETRIES", default=5)
CALLBACK_BACKOFF_S = env.float("REACH_CALLBACK_BACKOFF_S", default=1.0)
CALLBACK_TIMEOUT_S = env.float("REACH_CALLBACK_TIMEOUT_S", default=5.0)
# Where agents reach the control plane (A2A push notifications for tasks).
PUBLIC_URL = env.str("REACH_PUBLIC_URL", default="http://127.0.0.1:8000").rstrip("/")

CELERY_BROKER_URL = env.str("CELERY_BROKER_URL", default=REDIS_URL or "memory://")
CELERY_TASK_ALWAYS_EAGER = False
# Logging as the rest of the platform (settings.LOGGING, REACH_LOG_FORMAT): Celery would
# otherwise install its own format on the root logger.
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
# The queue workers take jobs from: one per deployment when several share a broker.
CELERY_TASK_DEFAULT_QUEUE = env.str("REACH_CELERY_QUEUE", default="celery")
# Worker processes run asynchronous tasks in an engine of their own (reach_platform.task_worker).
CELERY_IMPORTS = ["reach_platform.task_worker"]

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
# Usage events on disk until shipped, so a gateway process killed with SIGKILL loses
# none: one directory per deployment, shared by its gateway processes on this machine.
USAGE_SPOOL_DIR = Path(env.str("REACH_USAGE_SPOOL_DIR", default=str(DATA_DIR / "usage-spool")))
STATIC_ROOT = Path(env.str("REACH_STATIC_ROOT", default=str(DATA_DIR / "static")))
# WhiteNoise warns at every start about a missing root; collectstatic fills it in production.
STATIC_ROOT.mkdir(parents=True, exist_ok=True)
# The embedded default serves admin and Swagger assets straight from the
# installed apps; production may run collectstatic and turn this off.
WHITENOISE_USE_FINDERS = env.bool("REACH_STATIC_USE_FINDERS", default=True)

# Request bodies the control plane accepts (descriptors, schemas); the gateway
# has its own, separate limits.
DATA_UPLOAD_MAX_MEMORY_SIZE = env.int("REACH_API_MAX_BODY_BYTES", default=2 * 1024 * 1024)
# Heartbeats the API view judges at once per process (first beats, returns after a lapse,
# tier changes, Redis away): each holds a database connection; past this, 503 with
# Retry-After at once instead of queueing into time-outs. Default: the pool's size.
HEARTBEAT_VIEW_CONCURRENCY = env.int("REACH_HEARTBEAT_VIEW_CONCURRENCY",
                                     default=env.int("REACH_DB_POOL_SIZE", default=8))

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "reach_platform.authentication.BearerAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["tenants.permissions.TenantPermission"],
    # Bounded nesting, no duplicate keys, no NUL or lone surrogates (see the module).
    "DEFAULT_PARSER_CLASSES": ["reach_platform.parsers.StrictJSONParser"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    # ?limit= 1..1000, ?offset= >= 0, anything else a 400 (reach_platform.pagination).
    "DEFAULT_PAGINATION_CLASS": "reach_platform.pagination.StrictLimitOffsetPagination",
    "PAGE_SIZE": 100,
    "EXCEPTION_HANDLER": "reach_platform.errors.api_exception_handler",
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Agent-Reach API",
    "DESCRIPTION": (
        "The gateway (tag `gateway`: call agents by capability or intent, OpenAI-compatible "
        "chat, route dry runs) and the control plane: register agents, manage tenants, "
        "keys, grants, credentials and quotas, and read usage. "
        "Authenticate with `Authorization: Bearer <api key>`. Errors are always "
        '`{"error": {"code", "message", "request_id"}}`.'
    ),
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    "SCHEMA_PATH_PREFIX": r"/api/v1",
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums",
                             "reach_platform.openapi.add_gateway"],
    # Two choice sets are both a field named "kind": name each once.
    "ENUM_NAME_OVERRIDES": {
        "CredentialKindEnum": "tenants.choices.CredentialKind",
        "CapabilityKindEnum": "registry.choices.CapabilityKind",
        "DeliveryStatusEnum": "tasks.choices.DeliveryStatus",
        "ApiKeyStatusEnum": [("active", "active"), ("revoked", "revoked"),
                             ("expired", "expired")],
    },
}

# "text" for a terminal, "json" (one object per line) for a log pipeline. Either way
# every line carries the request id of the request it was written for, and each call
# through the gateway writes one line of its own (logger "reach.calls": tenant, agent,
# capability, instance, outcome and its four moments; REACH_CALL_LOG=false leaves it out).
LOG_FORMAT = env.str("REACH_LOG_FORMAT", default="text")
if LOG_FORMAT not in ("text", "json"):
    raise ImproperlyConfigured("REACH_LOG_FORMAT is 'text' or 'json'.")
LOG_LEVEL = env.str("REACH_LOG_LEVEL", default="INFO")
_ONE_FORMAT = {"handlers": ["console"], "propagate": False}
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"request_id": {"()": "reach_platform.middleware.RequestIdLogFilter"}},
    "formatters": {
        "text": {"format": "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s"},
        "json": {"()": "reach_platform.logs.JsonFormatter"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": LOG_FORMAT,
            "filters": ["request_id"],
        },
        "null": {"class": "logging.NullHandler"},
    },
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {
        # A request with a Host header we do not serve gets its 400; a stranger must not
        # be able to write a traceback into our log per request.
        # No handlers at all is not silence: logging's last resort prints the message
        # and its traceback to stderr (helper-53 found 40 lines per request).
        "django.security.DisallowedHost": {"handlers": ["null"], "propagate": False},
        # uvicorn's own lines in the same format as ours, not in a second one.
        "uvicorn": _ONE_FORMAT, "uvicorn.error": {**_ONE_FORMAT, "level": "INFO"},
        "uvicorn.access": _ONE_FORMAT,
        "reach.calls": {"level": LOG_LEVEL if env.bool("REACH_CALL_LOG", default=True)
                        else "WARNING"},
    },
}

# Failed API authentications per client address and window before that address gets
# 429 too_many_requests for the rest of the window (reach_platform.auth_throttle);
# 0 turns the throttle off.
AUTH_FAILURE_LIMIT = env.int("REACH_AUTH_FAILURE_LIMIT", default=20)
# Load shedding (gateway.app.LoadShedder): past either bound a call gets 503 overloaded
# with Retry-After at once. Measured with bench/overload.py (README, "Overload"):
#   .venv/bin/python bench/overload.py --caps 64,128,256,512,1024,0 --lags 0 ...
#   .venv/bin/python bench/overload.py --service-ms 1000 --agent-conns 4096 --factor 3 ...
# The count guards memory and sockets (~45 KB a call in flight), not the CPU: with a 30 ms
# agent no cap from 64 to unlimited kept 5x the sustainable load free of client time-outs,
# and 64 shed a healthy 1x load. A healthy load keeps rate x service time calls open
# (250/s of a 1 s agent: ~250; one process serves at most ~1,000/s): 1024 leaves
# headroom; raise it for slower agents (long streams).
GATEWAY_MAX_IN_FLIGHT = env.int("REACH_GATEWAY_MAX_IN_FLIGHT", default=1024)
# Each tenant's share of a gateway process's CPU for intent matching, in ms per second,
# and the most it may spend at once (gateway.intent_cpu): one tenant's long intents
# cannot stall everyone else's calls. 0: no limit.
GATEWAY_INTENT_CPU_MS_PER_S = env.float("REACH_GATEWAY_INTENT_CPU_MS_PER_S", default=500.0)
GATEWAY_INTENT_CPU_BURST_MS = env.float("REACH_GATEWAY_INTENT_CPU_BURST_MS", default=500.0)
# Every request head must be in within this (s), or 408 and the connection closed
# (reach_platform.http_protocol): slow or silent connections cannot pile up. 0: off.
HEADER_TIMEOUT_S = env.float("REACH_HEADER_TIMEOUT_S", default=10.0)
# The share of that limit one tenant's calls may hold (0 < share <= 1; 1: none kept back),
# so a tenant with slow agents or trickled bodies leaves the others a quarter of the slots.
GATEWAY_TENANT_SHARE = env.float("REACH_GATEWAY_TENANT_SHARE", default=0.75)
if not 0 < GATEWAY_TENANT_SHARE <= 1:
    raise ImproperlyConfigured("REACH_GATEWAY_TENANT_SHARE is a share: more than 0, at most 1.")
# How often, at most, a gateway writes its route table to DATA_DIR/routes.json, the
# fallback for a cold start with the database down.
ROUTES_SNAPSHOT_EVERY_S = env.float("REACH_ROUTES_SNAPSHOT_EVERY_S", default=30.0)
# Whether this process serves the gateway (and so follows the route table). The embedded
# default serves both; production runs control-plane processes with false, so route-table
# changes and heartbeats cost them nothing.
SERVE_GATEWAY = env.bool("REACH_SERVE_GATEWAY", default=True)
# An operator's agents file (registry.agents_file) applied for REACH_AGENTS_TENANT and
# re-applied within a second of every change (REACH_AGENTS_PRUNE: also remove the agents
# it no longer lists). Empty: none.
AGENTS_FILE = env.str("REACH_AGENTS_FILE", default="")
AGENTS_TENANT = env.str("REACH_AGENTS_TENANT", default="")
AGENTS_PRUNE = env.bool("REACH_AGENTS_PRUNE", default=False)
if AGENTS_FILE and not AGENTS_TENANT:
    raise ImproperlyConfigured("REACH_AGENTS_FILE needs REACH_AGENTS_TENANT (its owner's slug).")
# A gateway the console's "test call" sends its real call to (e.g. http://10.0.0.7:8080);
# the run command sets its own address. Empty: the console offers dry runs only.
CONSOLE_GATEWAY_URL = env.str("REACH_CONSOLE_GATEWAY_URL", default="")
# Whether it serves the API and the admin: false only in a gateway process, which
# reach_platform.gateway_settings configures (not an environment variable: those
# processes are started from their own entry point, reach_platform.gateway_asgi).
SERVE_API = True
# The CPU's guard: an event loop late by more than this (ms) three ticks in a row halves the
# limit on calls in flight until it is on time again (0: off). At 5x for 20 s with
# 0 / 20 / 50 ms: 2453 / 0 / 428 client time-outs; 20 ms also recovered fastest. 60 s at
# 5x with 20 ms (bench/overload.py --seconds 60 --after 30): 0 time-outs, 0 504s, 0 lost.
GATEWAY_MAX_LOOP_LAG_MS = env.float("REACH_GATEWAY_MAX_LOOP_LAG_MS", default=20.0)
# How long a call waits for a free connection to its agent (the agent's pool max_conns)
# before 503 upstream_busy.
GATEWAY_UPSTREAM_WAIT_S = env.float("REACH_GATEWAY_UPSTREAM_WAIT_S", default=1.0)
AUTH_FAILURE_WINDOW_S = env.int("REACH_AUTH_FAILURE_WINDOW_S", default=60)

# Upstream allow-list: CIDRs and host names ("*.svc.cluster.local") agents may
# register as endpoints and the gateway may connect to. Link-local and cloud
# metadata addresses are refused whatever this says.
UPSTREAM_ALLOW = env.list(
    "REACH_UPSTREAM_ALLOW",
    default=["127.0.0.0/8", "::1/128", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16",
             "fc00::/7", "localhost"],
)
# The platform's own listening ports: an agent endpoint on a local address with
# one of these would make the gateway call itself.
OWN_PORTS = [int(p) for p in env.list("REACH_OWN_PORTS", default=["8000"])]

# The gateway (data plane).
GATEWAY_MAX_BODY_BYTES = env.int("REACH_GATEWAY_MAX_BODY_BYTES", default=1024 * 1024)
GATEWAY_BODY_TIMEOUT_S = env.float("REACH_GATEWAY_BODY_TIMEOUT_S", default=10.0)
# A stream with no event for this long is cut with an SSE error event.
GATEWAY_STREAM_IDLE_S = env.float("REACH_GATEWAY_STREAM_IDLE_S", default=15.0)
# Source networks allowed to reach internal_only agents (with a tenant that may).
LOOPBACK_NETWORKS = ["127.0.0.0/8", "::1/128"]


def _networks(variable: str) -> tuple:
    return tuple(ipaddress.ip_network(n) for n in env.list(variable, default=LOOPBACK_NETWORKS))


GATEWAY_INTERNAL_NETWORKS = _networks("REACH_INTERNAL_NETWORKS")

# Who may read a gateway's /metrics (every tenant's names and volumes): these source
# networks, or any caller presenting REACH_METRICS_TOKEN as a bearer token.
METRICS_NETWORKS = _networks("REACH_METRICS_NETWORKS")
METRICS_TOKEN = env.str("REACH_METRICS_TOKEN", default="")

# Rate limits when Redis is unreachable (counted in reach_limits_degraded_total): true
# keeps each limit with a bucket per gateway process (at most rate x processes pass);
# false refuses the calls.
RATE_LIMIT_FAIL_OPEN = env.bool("REACH_RATE_LIMIT_FAIL_OPEN", default=True)
# Idempotency keys while Redis is unreachable: by default keyed calls get 503
# idempotency_unavailable with Retry-After (nothing runs twice); true runs them
# without de-duplication instead.
IDEMPOTENCY_FAIL_OPEN = env.bool("REACH_IDEMPOTENCY_FAIL_OPEN", default=False)
# Circuit breakers, per instance: the field's defaults (60 s window, 30 % failures
# after 10 calls, 30 s cool-down); tests shorten the cool-down.
GATEWAY_BREAKER_WINDOW_S = env.float("REACH_BREAKER_WINDOW_S", default=60.0)
GATEWAY_BREAKER_FAILURE_RATIO = env.float("REACH_BREAKER_FAILURE_RATIO", default=0.30)
GATEWAY_BREAKER_MIN_VOLUME = env.int("REACH_BREAKER_MIN_VOLUME", default=10)
GATEWAY_BREAKER_COOLDOWN_S = env.float("REACH_BREAKER_COOLDOWN_S", default=30.0)

# Intent matching: "multilingual" (default: a Chinese/English sentence encoder shipped in
# a package, about 80 MB per gateway process) or "lexical" (words only).
INTENT_EMBEDDER = env.str("REACH_INTENT_EMBEDDER", default="multilingual")
# Minimum match score for an intent to name a capability; unset: the matcher's own for
# the embedder (0.19 multilingual, 0.05 lexical), chosen on the routing tuning set.
INTENT_THRESHOLD = env.float("REACH_INTENT_THRESHOLD", default=None)

# A SQLite limitation the embedded mode accepts: the daily-usage uniqueness with
# NULL agent/capability is enforced on PostgreSQL only (one writer fills it).
SILENCED_SYSTEM_CHECKS = ["models.W047"]

# How often ApiKey.last_used_at is written: every authenticated request
# writing a row would turn reads into writes.
API_KEY_LAST_USED_RESOLUTION_SECONDS = 60
