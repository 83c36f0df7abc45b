"""Settings that only a production broker reads, re-evaluated in a child process."""

from __future__ import annotations

import ast

from tests.config.test_env_file import settings_of

REDIS = "redis://127.0.0.1:6379/0"


def test_a_redis_broker_gets_socket_timeouts_the_environment_can_change():
    options = settings_of("", CELERY_BROKER_URL=REDIS)["settings"]
    transport = ast.literal_eval(options["CELERY_BROKER_TRANSPORT_OPTIONS"])
    assert transport["socket_connect_timeout"] == transport["socket_timeout"] == 2
    # One retry of a publish, so a hung broker costs a submit two timeouts, not four.
    assert ast.literal_eval(options["CELERY_TASK_PUBLISH_RETRY_POLICY"])["max_retries"] == 1
    longer = settings_of("", CELERY_BROKER_URL=REDIS, CELERY_BROKER_SOCKET_TIMEOUT_S="5")
    transport = ast.literal_eval(longer["settings"]["CELERY_BROKER_TRANSPORT_OPTIONS"])
    assert transport["socket_connect_timeout"] == transport["socket_timeout"] == 5


def test_postgresql_connections_prepare_statements_unless_turned_off():
    url = "postgres://postgres@127.0.0.1:5432/serving_school"
    on = ast.literal_eval(settings_of("", DATABASE_URL=url)["settings"]["DATABASES"])["default"]
    assert on["OPTIONS"]["server_side_binding"] is True
    assert on["OPTIONS"]["prepare_threshold"] == 5
    off = settings_of("", DATABASE_URL=url, DB_PREPARED_STATEMENTS="0")["settings"]
    options = ast.literal_eval(off["DATABASES"])["default"]["OPTIONS"]
    # Django's default: client-side binding, nothing prepared (a transaction-pooling PgBouncer).
    assert "server_side_binding" not in options and "prepare_threshold" not in options
