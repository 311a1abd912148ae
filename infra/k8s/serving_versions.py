"""What a release puts on a Kueue platform's model servers: which registered versions run, how many
replicas each, and the share of the requests the gateways draw for the canary."""

from __future__ import annotations

import hashlib
import re
from dataclasses import KW_ONLY, dataclass
from typing import Literal

# The tightest name a slug goes into: a multi-node version's LeaderWorkerSet, model-server-<slug>, makes a
# StatefulSet per group named after its leader pod, model-server-<slug>-<group> (lws site/content/en/docs/
# concepts/_index.md, the example's pods), and the StatefulSet controller labels each pod
# controller-revision-hash: <StatefulSet name>-<hash of up to 10 characters>, a label value of at most 63
# characters, with no truncation: a longer name creates no pod (kubernetes/kubernetes#64023, open). With
# up to 999 groups: 63 - len("model-server-") - len("-999") - len("-") - 10 = 35 characters.
_SLUG_MAX = 35
_NOT_IN_LABEL = re.compile(r"[^a-z0-9-]+")


@dataclass(frozen=True)
class ServedVersion:
    """A registered version as the model servers run it."""

    reference: str
    """NAME@VERSION, as the registry names it."""
    model: str
    """Its files: a path on the shared filesystem or an object-store URI."""

    @property
    def slug(self) -> str:
        """The version in object names and labels: `@` as `-v`; a reference that is not already lower case
        [a-z0-9-] (the registry's names are case-sensitive: `Embedder`, `embedder` and `em_bedder` are three
        models) or is too long is cut to those characters and told apart by a hash of the whole reference."""
        name, _, version = self.reference.partition("@")
        plain = f"{name}-v{version}"
        slug = _NOT_IN_LABEL.sub("-", plain.lower()).strip("-")
        if slug == plain and len(slug) <= _SLUG_MAX:
            return slug
        digest = hashlib.sha256(self.reference.encode()).hexdigest()[:8]
        return f"{slug[: _SLUG_MAX - 9].rstrip('-')}-{digest}"


@dataclass(frozen=True)
class ServingRelease:
    """The versions on the model servers at one moment of a release."""

    stable: ServedVersion
    _: KW_ONLY
    stable_replicas: int | None = None
    """None: the ScaledObject owns the count; a promotion sets the count the old stable version had, so
    that the new one starts its life as stable with the capacity the old one had."""
    canary: ServedVersion | None = None
    canary_percent: int = 0
    """The share of the requests each gateway sends the canary (0-99)."""
    canary_replicas: int = 1
    retiring: ServedVersion | None = None
    """The stable version before a promotion: its replicas keep running, with no request sent to them,
    until the new stable version's replicas are ready and the gateways no longer name it."""
    retiring_replicas: int = 0
    stack_model: Literal["gone", "serving", "retiring"] = "gone"
    """The objects of the stack's own `serving.model` (`gpuplat up`'s model-server): during a first release
    they keep serving while the release's stable version starts beside them ("serving": the gateways and
    KEDA still name them), then run named by no gateway ("retiring") until they are removed."""

    def __post_init__(self) -> None:
        if self.stack_model == "serving" and (self.canary is not None or self.retiring is not None):
            raise ValueError("the stack's own model is stable: no canary or retiring version beside it")
        if not 0 <= self.canary_percent <= 99:
            raise ValueError(f"canary share {self.canary_percent} %: 0 to 99")
        if self.canary is None and self.canary_percent:
            raise ValueError("a canary share without a canary version")
        if self.canary is not None and self.canary_replicas < 1:
            raise ValueError("a canary version runs at least one replica")
        slugs = [v.slug for v in (self.stable, self.canary, self.retiring) if v is not None]
        if len(set(slugs)) != len(slugs):
            raise ValueError(f"one version in two roles: {', '.join(slugs)}")
