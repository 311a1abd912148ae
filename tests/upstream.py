"""Upstream data the tests read (CRDs, NCCL output samples, Helm chart defaults), stored in the repository
under tests/data/upstream/ with its sources and checksums (each folder's SOURCES.md)."""

from __future__ import annotations

from pathlib import Path

UPSTREAM = Path(__file__).resolve().parent / "data" / "upstream"
CRDS = UPSTREAM / "k8s-crds"
NCCL_SAMPLES = UPSTREAM / "nccl-samples"
HELM_VALUES = UPSTREAM / "helm-values"
