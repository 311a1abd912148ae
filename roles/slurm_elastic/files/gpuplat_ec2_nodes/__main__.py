"""``python3 -m gpuplat_ec2_nodes``: the command line (the role's launcher calls cli.main)."""

import sys

from .cli import main

sys.exit(main())
