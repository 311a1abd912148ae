"""The mark of a model-server replica the platform stopped on purpose (lent to a canary), as the model-server
role writes it for the replicas it retires: one file per replica in node_exporter's textfile collector
directory, a gauge labelled replica and reason. The monitoring role's InferenceServerDown does not page for
a replica it names (roles/monitoring templates/gpuplat-alerts.rules.yml.j2); a replica that died has none
and pages. Written before the replica stops, removed once it serves again."""

from __future__ import annotations

from infra.nodes.role_templates import role_defaults, role_vars

_DEFAULTS, _VARS = role_defaults("inference_server"), role_vars("inference_server")
TEXTFILE_DIR = str(_DEFAULTS["inference_server_textfile_dir"])
METRIC = str(_VARS["__inference_server_stopped_metric"])
_FILE = str(_VARS["__inference_server_stopped_file"])

# Written whole (node_exporter reads *.prom only: the temporary name is not one) where the node has the
# collector's directory; a node without node_exporter has nothing to mark.
WRITE = '[ ! -d "$1" ] || { printf %s "$3" > "$1/.$2.tmp" && mv "$1/.$2.tmp" "$1/$2"; }'
REMOVE = 'rm -f "$1/$2"'


def mark_file(replica: int) -> str:
    """Replica `replica`'s file name in the textfile collector's directory."""
    return _FILE % replica


def mark(replica: int, reason: str) -> str:
    """The file's text: the gauge at 1 for `replica`, stopped for `reason`."""
    return (
        f"# HELP {METRIC} A model-server replica the platform stopped on purpose: no page for it.\n"
        f"# TYPE {METRIC} gauge\n"
        f'{METRIC}{{replica="{replica}",reason="{reason}"}} 1\n'
    )


def write_command(replica: int, reason: str) -> tuple[str, ...]:
    """The command that marks `replica` on its node (sh -c, its arguments)."""
    return ("sh", "-c", WRITE, "sh", TEXTFILE_DIR, mark_file(replica), mark(replica, reason))


def remove_command(replica: int) -> tuple[str, ...]:
    """The command that takes `replica`'s mark away on its node."""
    return ("sh", "-c", REMOVE, "sh", TEXTFILE_DIR, mark_file(replica))
