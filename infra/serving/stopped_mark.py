"""The mark of a model-server replica the platform stopped on purpose (lent to a canary), as the model-server
role writes it for the replicas it retires: one file per replica in node_exporter's textfile collector
directory, a gauge labelled replica and reason. The monitoring role's InferenceServerDown does not page for
a replica it names (roles/monitoring templates/gpuplat-alerts.rules.yml.j2); a replica that died has none
and pages. Written once the replica stopped (a command killed before the stop leaves no mark on a replica
that runs on), removed once it serves again, and at the node's next boot (the role's tmpfiles.d line: the
replica starts at boot, the runtime mask gone), so that it silences only a replica the platform stopped
and that has not run since.

The directory is the one the role recorded on the node (vars/main.yml __inference_server_textfile_record,
in its configuration directory), node_exporter's own: no second default here that could name another."""

from __future__ import annotations

from infra.nodes.role_templates import role_defaults, role_vars

_DEFAULTS, _VARS = role_defaults("inference_server"), role_vars("inference_server")
RECORD = f"{_DEFAULTS['inference_server_config_dir']}/{_VARS['__inference_server_textfile_record']}"
METRIC = str(_VARS["__inference_server_stopped_metric"])
_FILE = str(_VARS["__inference_server_stopped_file"])

# The directory the record names (its one line), where it is one: a node without node_exporter, or not
# converged since the role recorded it, has nothing to mark.
_DIR = 'd=$(cat "$1" 2>/dev/null) && [ -n "$d" ] && [ -d "$d" ] || exit 0; '
# Written whole (node_exporter reads *.prom only: the temporary name is not one).
WRITE = _DIR + 'printf %s "$3" > "$d/.$2.tmp" && mv "$d/.$2.tmp" "$d/$2"'
REMOVE = _DIR + 'rm -f "$d/$2"'


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
    return ("sh", "-c", WRITE, "sh", RECORD, mark_file(replica), mark(replica, reason))


def remove_command(replica: int) -> tuple[str, ...]:
    """The command that takes `replica`'s mark away on its node."""
    return ("sh", "-c", REMOVE, "sh", RECORD, mark_file(replica))
