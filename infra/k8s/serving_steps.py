"""The steps of a release on the Kueue platform: each the objects of one `ServingRelease`, applied in
order, with what must hold before the next step starts.

- deploy --canary P: the canary's workload starts at share 0 and must be ready before any request is
  drawn for it; then the gateways draw P %.
- promote: the canary scales to the stable version's replica count while it keeps its share (the stable
  replicas keep the rest), and must be ready; only then do the gateways send it every request (the old
  stable version's replicas still running, named by no gateway); once every gateway runs that
  configuration the old workload is removed. No moment has every request on one replica set smaller
  than the stable one was.
- rollback: the canary's share goes to 0; once every gateway runs that configuration (a gateway pod that
  still drew for the canary finishes its requests in flight before it ends) the canary's workload is
  removed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from infra.k8s.serving import MODEL_SERVER, MODEL_SERVER_REPLICAS, version_track_names
from infra.k8s.serving_versions import ServedVersion, ServingRelease


class ReleaseRefused(ValueError):
    """The step asked for does not follow from where the release stands."""


@dataclass(frozen=True)
class ReleaseStep:
    says: str
    release: ServingRelease
    """The objects to apply (infra.k8s.serving.serving_objects with this release)."""
    ready: tuple[str, int] | None = None
    """A workload and the replicas of it that must be ready before the next step."""
    gateways_rolled: bool = False
    """Every gateway pod must run this step's configuration (the rollout done, no older pod left) before
    the next step."""
    removes: tuple[str, ...] = ()
    """Workloads (each with its headless Service) deleted after this step's objects are applied."""


def _removed(version: ServedVersion) -> tuple[str, ...]:
    return version_track_names(version)


def take_over(stack_model: str, version: ServedVersion, replicas: int) -> list[ReleaseStep]:
    """The first release on a stack that `gpuplat up` serves `serving.model` on (`stack_model`, its files):
    `version`, those files as registered, starts beside the stack's own model servers with as many
    replicas, takes every request once ready, and the stack's own objects go once no gateway draws for
    them. Only the same files: until the switch, the stack's own Service (its selector takes every
    model-server pod, and a Service's selector matches on labels that are there, never on one missing)
    sends the stack's share of the requests to the new pods too."""
    if version.model != stack_model:
        raise ReleaseRefused(
            f"{version.reference} is {version.model}, not the stack's own model {stack_model}: register "
            "serving.model's files and deploy that version first, then a canary of this one"
        )
    workload, _ = version_track_names(version)
    count = max(replicas, 1)
    return [
        ReleaseStep(
            f"starting {version.reference} beside the stack's own model servers",
            ServingRelease(version, stable_replicas=count, stack_model="serving"),
            (workload, count),
        ),
        ReleaseStep(
            f"{version.reference} serves every request; the stack's own model servers keep running until "
            "every gateway runs without them",
            ServingRelease(version, stable_replicas=count, stack_model="retiring"),
            gateways_rolled=True,
        ),
        ReleaseStep(
            "the stack's own model servers stopped",
            ServingRelease(version, stable_replicas=count),
            removes=(MODEL_SERVER, MODEL_SERVER_REPLICAS),
        ),
    ]


def deploy_canary(current: ServingRelease, version: ServedVersion, percent: int) -> list[ReleaseStep]:
    if current.stack_model != "gone":
        raise ReleaseRefused(
            f"the stack's own model servers still run beside {current.stable.reference}: finish taking "
            "over from them first"
        )
    if current.canary is not None and current.canary == version:
        # The same deploy again (the first cut short while its canary started) or a new share for it.
        workload, _ = version_track_names(version)
        return [
            ReleaseStep(
                f"{version.reference} ready beside {current.stable.reference}",
                current,
                (workload, current.canary_replicas),
            ),
            ReleaseStep(
                f"{version.reference} takes {percent} % of the requests",
                replace(current, canary_percent=percent),
                gateways_rolled=True,
            ),
        ]
    if current.canary is not None:
        raise ReleaseRefused(
            f"{current.canary.reference} is already in canary: promote it or roll it back before "
            f"deploying {version.reference}"
        )
    if current.retiring is not None:
        raise ReleaseRefused(
            f"the promotion of {current.stable.reference} did not end ({current.retiring.reference} still "
            "runs): run `gpuplat serve promote` again to finish it"
        )
    if version.slug == current.stable.slug:
        raise ReleaseRefused(f"{version.reference} is the stable version already")
    workload, _ = version_track_names(version)
    starting = replace(current, canary=version, canary_percent=0, canary_replicas=1)
    return [
        ReleaseStep(
            f"starting {version.reference} beside {current.stable.reference}", starting, (workload, 1)
        ),
        ReleaseStep(
            f"{version.reference} takes {percent} % of the requests",
            replace(starting, canary_percent=percent),
            gateways_rolled=True,
        ),
    ]


def promote(current: ServingRelease, stable_replicas: int) -> list[ReleaseStep]:
    """`stable_replicas`: the stable version's replicas now (what its workload runs). A promotion (or a
    take-over) cut short after the switch is finished: deploy_canary tells the user to promote again."""
    canary = current.canary
    if canary is None and (current.retiring is not None or current.stack_model == "retiring"):
        return finish_promotion(current)
    if canary is None:
        raise ReleaseRefused(f"no canary to promote: {current.stable.reference} serves every request")
    replicas = max(stable_replicas, 1)
    workload, _ = version_track_names(canary)
    grown = replace(current, canary_replicas=max(replicas, current.canary_replicas))
    switched = ServingRelease(
        canary, stable_replicas=grown.canary_replicas, retiring=current.stable, retiring_replicas=replicas
    )
    return [
        ReleaseStep(
            f"{canary.reference} grows to {grown.canary_replicas} replicas at its {current.canary_percent} %",
            grown,
            (workload, grown.canary_replicas),
        ),
        ReleaseStep(
            f"{canary.reference} serves every request; {current.stable.reference} keeps its replicas until "
            "every gateway runs without it",
            switched,
            gateways_rolled=True,
        ),
        ReleaseStep(
            f"{current.stable.reference} stopped",
            ServingRelease(canary, stable_replicas=grown.canary_replicas),
            removes=_removed(current.stable),
        ),
    ]


def finish_promotion(current: ServingRelease) -> list[ReleaseStep]:
    """A promotion (or a take-over) cut short after the gateways switched: the old stable version (or the
    stack's own model servers) still runs."""
    if current.retiring is not None:
        return [
            ReleaseStep(
                f"{current.retiring.reference} stopped",
                replace(current, retiring=None, retiring_replicas=0),
                removes=_removed(current.retiring),
            )
        ]
    if current.stack_model == "retiring":
        return [
            ReleaseStep(
                "the stack's own model servers stopped",
                replace(current, stack_model="gone"),
                removes=(MODEL_SERVER, MODEL_SERVER_REPLICAS),
            )
        ]
    raise ReleaseRefused("no promotion to finish")


def rollback(current: ServingRelease) -> list[ReleaseStep]:
    canary = current.canary
    if canary is None:
        raise ReleaseRefused(f"no canary to roll back: {current.stable.reference} serves every request")
    drawn_for_none = replace(current, canary_percent=0)
    return [
        ReleaseStep(f"{canary.reference} takes no new request", drawn_for_none, gateways_rolled=True),
        ReleaseStep(
            f"{canary.reference} stopped",
            replace(current, canary=None, canary_percent=0, canary_replicas=1),
            removes=_removed(canary),
        ),
    ]
