# Mitogen's linear strategy (mitogen_linear) with every process free to run on any CPU of a machine with
# fewer than 4 CPUs.
#
# Mitogen pins its processes to CPUs (mitogen 0.3.54, ansible_mitogen/affinity.py FixedPolicy): on a machine
# with 2 or 3 CPUs its connection multiplexer gets CPU 0, and the controller, every worker and every child of
# the multiplexer get the CPUs after it (with 2 CPUs: CPU 1 alone). The children of the multiplexer are the
# nodes' interpreters that setns starts, so every module run in a node (apt, pip, dpkg-query, systemctl)
# shares that one CPU with the controller and its workers, while the other CPU holds only the multiplexer
# (checked here on 2026-12-07: Cpus_allowed_list 1 for ansible-playbook, its workers and the nodes'
# python3, 0 for `mitogen mux:0`). gpuplat's machines have 2 CPUs, shared with the containers' own
# services: pinned, the scheduler cannot move any of them to the CPU that is free. Mitogen has no setting
# for it (affinity.py's `policy` is chosen at import); its base Policy places nothing, and is put in its
# place here before the strategy's first run starts the multiplexer (ansible_mitogen/process.py
# common_setup and MuxProcess read `ansible_mitogen.affinity.policy` when they run, the workers in
# strategy.py wrap_worker__run). infra/nodes/mitogen.py names this strategy; tests/unit/test_mitogen_runs.py
# checks where a node's module and a worker may run.
from __future__ import annotations

import ansible_mitogen.affinity
from ansible_mitogen.plugins.strategy import mitogen_linear

# From 4 CPUs Mitogen's placement keeps CPUs 0 and 1 for the multiplexer and the controller and spreads the
# workers and the nodes' interpreters over the others (affinity.py FixedPolicy.__init__, "big SMP"): kept.
SPREADS_FROM_CPUS = 4


def placement(current: ansible_mitogen.affinity.Policy) -> ansible_mitogen.affinity.Policy:
    """Mitogen's placement where it spreads the work, its base Policy (places nothing) where it crowds it."""
    if getattr(current, "cpu_count", 0) >= SPREADS_FROM_CPUS:
        return current
    return ansible_mitogen.affinity.Policy()


class StrategyModule(mitogen_linear.StrategyModule):
    def run(self, iterator, play_context, result=0):
        ansible_mitogen.affinity.policy = placement(ansible_mitogen.affinity.policy)
        return super().run(iterator, play_context, result)
