"""The version an AWS stack's stable replicas serve, kept where an inference instance booted later reads it.

On local and on-premises stacks the nodes are the stack file's: `gpuplat serve` writes each replica's version
file and no other node appears. On aws the serving pool is an Auto Scaling group: an instance it starts after
a promote boots from the launch template, which knows only the stack's own model. So each time the stable
replicas move to a version (a promote, a rollback, a promote cut short and undone), the release first writes
that version's file text to an SSM parameter of the stack (`serving_version_parameter`), or deletes it for
the stack's own model; an inference instance's boot (infra/backends/aws/node_join.py) reads it and writes
the same file for each of its replicas before they start. Written before the replicas roll: an instance
booted while they roll serves the version they roll to, never the one they leave.

IAM (infra/backends/aws/iam.py serving_version_statements): the inference nodes' role reads it, no node role
writes it, and every other node role is denied even a read; the operator's credentials write it
(ssm:PutParameter, ssm:DeleteParameter on the parameter).
"""

from __future__ import annotations

from typing import Any

from infra.backends.aws.bootstrap import serving_version_parameter
from infra.errors import GpuPlatError


class VersionRecord:
    """The stack's version record (an SSM String parameter): the version file's text, absent for the
    stack's own model."""

    def __init__(self, stack: str, ssm: Any) -> None:
        self.name = serving_version_parameter(stack)
        self.ssm = ssm

    def write(self, environment: str | None) -> None:
        """Record `environment` (a version file's text), or None: the stack's own model."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            if environment is None:
                self.ssm.delete_parameter(Name=self.name)
            else:
                self.ssm.put_parameter(
                    Name=self.name,
                    Value=environment,
                    Type="String",
                    Overwrite=True,
                    Description="gpuplat serve: the version the stable replicas serve (a version file)",
                )
        except ClientError as error:
            if environment is None and _not_found(error):
                return
            raise self._failed("write", error) from None
        except BotoCoreError as error:
            raise self._failed("write", error) from None

    def read(self) -> str | None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return str(self.ssm.get_parameter(Name=self.name)["Parameter"]["Value"])
        except ClientError as error:
            if _not_found(error):
                return None
            raise self._failed("read", error) from None
        except BotoCoreError as error:
            raise self._failed("read", error) from None

    def _failed(self, what: str, error: Exception) -> GpuPlatError:
        action = "ssm:GetParameter" if what == "read" else "ssm:PutParameter and ssm:DeleteParameter"
        return GpuPlatError(
            f"cannot {what} the stack's version record (SSM parameter {self.name}): {error}. Instances the "
            f"serving pool starts later boot on the version it names: your credentials need {action} on it; "
            "nothing on the model servers changed in this step"
        )


def _not_found(error: Any) -> bool:
    return str(error.response.get("Error", {}).get("Code")) == "ParameterNotFound"
