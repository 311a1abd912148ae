"""The command line: arguments, logging, and each command to its module."""

from __future__ import annotations

import argparse
import os
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

from . import __doc__ as PACKAGE_DOC
from .ec2 import ec2_nodes
from .exit_codes import EXIT_OK, EXIT_USAGE, UsageError
from .holds import pools_report, unprotect
from .hostlist import expand_hostlist
from .keep_static import keep_static
from .logs import LOG, configure_logging
from .reconcile import reconcile
from .resume import resume, resume_fail
from .resume_file import read_resume_file
from .settings import DEFAULT_CONFIG, load_settings
from .slurm import Slurm
from .spot_watch import DEFAULT_IMDS_URL, SpotWatch, spot_watch
from .suspend import suspend
from .teardown import teardown


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gpuplat-ec2-nodes", description=PACKAGE_DOC.splitlines()[0])
    parser.add_argument("--config", type=Path, default=Path(DEFAULT_CONFIG))
    parser.add_argument("--endpoint-url", help="EC2 endpoint (default: boto3's, AWS_ENDPOINT_URL honoured)")
    parser.add_argument("--log-file", help="also append the log to this file")
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("resume", "suspend", "resume-fail"):
        sub = commands.add_parser(name)
        sub.add_argument("hostlist", nargs="+", help="Slurm hostlist, e.g. train-[0-3,5]")
    commands.add_parser("pools", help="each pool's hold (capacity cool-down, protected mode) as JSON")
    unprotect_parser = commands.add_parser("unprotect", help="end a pool's protected mode")
    unprotect_parser.add_argument("pool")
    commands.add_parser("keep-static")
    commands.add_parser("reconcile")
    teardown_parser = commands.add_parser("teardown")
    teardown_parser.add_argument("--timeout-seconds", type=float, default=600.0)
    teardown_parser.add_argument("--poll-seconds", type=float, default=10.0)
    spot = commands.add_parser("spot-watch")
    spot.add_argument("--node-name", default=socket.gethostname().split(".")[0])
    spot.add_argument("--imds-url", default=DEFAULT_IMDS_URL)
    spot.add_argument("--grace-seconds", type=float, default=90.0)
    spot.add_argument("--interval-seconds", type=float, default=5.0)
    spot.add_argument("--scontrol", default="/usr/bin/scontrol")
    return parser.parse_args(argv)


def run(args: argparse.Namespace) -> int:
    if args.command == "spot-watch":
        watch = SpotWatch(args.node_name, args.imds_url, args.grace_seconds, args.interval_seconds)
        return spot_watch(watch, Slurm(args.scontrol))
    settings = load_settings(args.config)
    slurm = Slurm(settings.scontrol)
    if args.command == "pools":
        print(pools_report(settings))
        return EXIT_OK
    if args.command == "unprotect":
        return unprotect(settings, slurm, args.pool)
    ec2 = ec2_nodes(settings.region, args.endpoint_url, settings.stack)
    if args.command == "keep-static":
        return keep_static(settings, slurm, ec2)
    if args.command == "reconcile":
        return reconcile(settings, ec2, slurm)
    if args.command == "teardown":
        return teardown(settings, ec2, args.timeout_seconds, args.poll_seconds)
    names = expand_hostlist(",".join(args.hostlist))
    if args.command == "resume":
        return resume(settings, ec2, slurm, names, jobs=read_resume_file(os.environ.get("SLURM_RESUME_FILE")))
    if args.command == "resume-fail":
        return resume_fail(settings, ec2, slurm, names)
    return suspend(settings, ec2, slurm, names)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    configure_logging(args.log_file)
    try:
        return run(args)
    except UsageError as err:
        LOG.error("%s", err)
        return EXIT_USAGE
