"""The program's log: stderr, syslog (/dev/log) and, with --log-file, a file."""

from __future__ import annotations

import logging
import logging.handlers
import sys
from pathlib import Path

LOG = logging.getLogger("gpuplat-ec2-nodes")


def configure_logging(log_file: str | None) -> None:
    LOG.setLevel(logging.INFO)
    LOG.propagate = False
    for handler in list(LOG.handlers):
        LOG.removeHandler(handler)
        handler.close()
    stderr = logging.StreamHandler(sys.stderr)
    stderr.setFormatter(logging.Formatter("%(asctime)s gpuplat-ec2-nodes %(levelname)s %(message)s"))
    LOG.addHandler(stderr)
    if Path("/dev/log").exists():
        try:
            syslog = logging.handlers.SysLogHandler(address="/dev/log")
        except OSError:
            pass
        else:
            syslog.setFormatter(logging.Formatter("gpuplat-ec2-nodes: %(levelname)s %(message)s"))
            LOG.addHandler(syslog)
    if log_file:
        try:
            file_handler = logging.FileHandler(log_file)
        except OSError as err:
            LOG.warning("cannot write the log file %s: %s", log_file, err)
        else:
            file_handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
            LOG.addHandler(file_handler)
