"""Airflow's task-log server on one address: ``python -m velocity_airflow.log_server HOST PORT``.

Airflow's own (``airflow.utils.serve_logs``, started by the scheduler for the LocalExecutor's
workers and by the triggerer) listens on every interface and has no setting for the host.
``infra/airflow.sh`` runs those two components with ``--skip-serve-logs`` and this instead,
bound to loopback: the same application, so the api-server reads a running task's log from
it as before (requests signed with ``[api] secret_key``).
"""

from __future__ import annotations

import sys


def loopback_hostname() -> str:
    """``[core] hostname_callable`` of infra/airflow.sh: the host a task or trigger records,
    and so where the api-server fetches its running log from, is this loopback address
    (the default, the FQDN, may resolve to 127.0.1.1 or an outside interface, where the log
    servers do not listen)."""
    return "127.0.0.1"


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or not args[1].isdigit():
        raise SystemExit("usage: python -m velocity_airflow.log_server HOST PORT")
    import uvicorn
    from airflow.configuration import conf

    uvicorn.run(
        "airflow.utils.serve_logs.log_server:get_app",
        factory=True,
        host=args[0],
        port=int(args[1]),
        log_level=conf.get("logging", "uvicorn_logging_level", fallback="info").lower(),
        log_config=None,  # keep Airflow's logging, as its own log server does
        access_log=False,
    )


if __name__ == "__main__":
    main()
