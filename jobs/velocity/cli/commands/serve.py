"""`velocity serve`: the HTTP check service in the foreground (SPEC §5a for services in
other languages); `velocity up` starts the same in the background."""

from __future__ import annotations

import argparse

from velocity.cli.shared import EXIT_OK, settings_from


def serve(args: argparse.Namespace) -> int:
    from velocity.operating.local_process import run_ahead
    from velocity.serving.service import CheckService

    settings = settings_from(args)
    service = CheckService.open(settings)
    where = f"in {service.token_file}" if service.token_file is not None else "VELOCITY_CHECK_TOKEN"
    print(f"check service on {service.url}: POST /check, GET /healthz, GET /metrics", flush=True)
    print(f"bearer token: {where}", flush=True)
    # Before uvicorn starts its threads, which inherit it.
    scheduling = run_ahead(0, settings.serving_nice, settings.serving_realtime)
    print(f"scheduling: {scheduling}", flush=True)
    service.run()
    print("check service stopped", flush=True)
    return EXIT_OK
