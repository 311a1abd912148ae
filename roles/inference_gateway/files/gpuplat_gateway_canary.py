#!/usr/bin/env python3
"""A canary release's share of the requests at the inference gateway (local and on-premises stacks).

The frontend draws a number from 0 to 99 per request (rand(100)) and sends it to the backend the version
map names for that draw: `inference` (the stable version) or `inference_canary` (the canary's servers,
inference_gateway_canary_servers). The share is a draw, not a server weight, because HAProxy's
least-connections balancing ignores weights while servers are equally loaded (measured on HAProxy 2.6.12:
two servers weighted 4:1 took 150 and 150 of 300 sequential requests; a map with 20 canary draws sent 60
of 300 to the canary).

    gpuplat_gateway_canary.py share PERCENT   draws 0..PERCENT-1 to the canary, the rest to the stable version
    gpuplat_gateway_canary.py show            the share and each version's requests and failed answers so far
                                              (4xx, 5xx and aborted; JSON)

`share` changes only the draws that move, through the runtime API (`set map <file> <draw> <backend>`, no
reload, answered with an empty line), then rewrites the map file so a reload keeps the share. A share
above 0 needs a canary server that HAProxy's health checks count up. Exit 0 done, 2 refused.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from gpuplat_gateway_targets import RuntimeApi, RuntimeApiError

LOG = logging.getLogger("gpuplat-gateway-canary")
STABLE, CANARY = "inference", "inference_canary"
DRAWS = 100


def version_map(percent: int) -> dict[int, str]:
    """The backend of each draw for a canary share: draws below `percent` go to the canary."""
    if not 0 <= percent <= 100:
        raise ValueError(f"a canary share is a whole percentage from 0 to 100, not {percent}")
    return {draw: CANARY if draw < percent else STABLE for draw in range(DRAWS)}


def map_changes(current: dict[int, str], wanted: dict[int, str]) -> list[tuple[int, str]]:
    """The entries to set to turn one version map into another."""
    return [(draw, backend) for draw, backend in sorted(wanted.items()) if current.get(draw) != backend]


def parse_map(text: str) -> dict[int, str]:
    """`show map <file>` answers one `<entry id> <key> <value>` line per entry."""
    entries = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 3 and fields[1].isdigit():
            entries[int(fields[1])] = fields[2]
    return entries


# `show stat` fields (HAProxy 2.6 doc/management.txt, section 9.1, fields 42, 43, 49, 50): hrsp_4xx and
# hrsp_5xx count answers by status; cli_abrt and srv_abrt the transfers the client or the server aborted (an
# answer cut off mid-stream, its status already counted or never sent).
ERROR_FIELDS = ("hrsp_4xx", "hrsp_5xx", "cli_abrt", "srv_abrt")


def backend_figures(api: RuntimeApi) -> dict[str, dict[str, int]]:
    """Requests, failed answers (4xx, 5xx, aborted: `errors`, at most `requests`; `errors_5xx` of them 5xx)
    and servers up of each version's backend, since HAProxy started."""
    figures = {}
    for backend in (STABLE, CANARY):
        rows = api.stats(backend)
        total = rows.get("BACKEND", {})
        requests = int(total.get("stot") or 0)
        figures[backend] = {
            "requests": requests,
            "errors": min(requests, sum(int(total.get(field) or 0) for field in ERROR_FIELDS)),
            "errors_5xx": int(total.get("hrsp_5xx") or 0),
            "servers_up": sum(
                1
                for name, row in rows.items()
                if name not in ("FRONTEND", "BACKEND") and str(row.get("status", "")).startswith("UP")
            ),
        }
    return figures


def show(api: RuntimeApi, map_file: Path) -> dict[str, Any]:
    entries = parse_map(api.send(f"show map {map_file}"))
    return {
        "canary_percent": sum(backend == CANARY for backend in entries.values()),
        "backends": backend_figures(api),
    }


def share(api: RuntimeApi, map_file: Path, percent: int) -> dict[str, Any]:
    wanted = version_map(percent)
    if percent > 0 and backend_figures(api)[CANARY]["servers_up"] == 0:
        raise RuntimeApiError(
            f"no server of backend {CANARY} is up: deploy the canary's model servers "
            "(inference_gateway_canary_servers) and let their health checks pass before giving them a share"
        )
    current = parse_map(api.send(f"show map {map_file}"))
    for draw, backend in map_changes(current, wanted):
        answer = api.send(f"set map {map_file} {draw} {backend}").strip()
        if answer:
            raise RuntimeApiError(f"HAProxy refused 'set map {map_file} {draw} {backend}': {answer}")
    write_map(map_file, wanted)
    return show(api, map_file)


def write_map(map_file: Path, entries: dict[int, str]) -> None:
    text = "".join(f"{draw} {backend}\n" for draw, backend in sorted(entries.items()))
    handle, temporary = tempfile.mkstemp(dir=map_file.parent, prefix=f".{map_file.name}.")
    with os.fdopen(handle, "w") as out:
        out.write(text)
    os.chmod(temporary, 0o644)
    os.replace(temporary, map_file)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gpuplat_gateway_canary.py", description=__doc__.splitlines()[0])
    parser.add_argument("--socket", default="/run/haproxy/admin.sock", help="HAProxy's admin stats socket")
    parser.add_argument("--map", type=Path, default=Path("/etc/haproxy/gpuplat-versions.map"))
    commands = parser.add_subparsers(dest="command", required=True)
    share_parser = commands.add_parser("share", help="give the canary PERCENT of the requests")
    share_parser.add_argument("percent", type=int)
    commands.add_parser("show", help="the share and each version's requests and errors (JSON)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    args = parse_args(argv)
    api = RuntimeApi(args.socket)
    try:
        result = share(api, args.map, args.percent) if args.command == "share" else show(api, args.map)
    except (RuntimeApiError, ValueError) as exc:
        LOG.error("%s", exc)
        return 2
    except OSError as exc:
        LOG.error("HAProxy's runtime API at %s: %s", args.socket, exc)
        return 2
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
