"""Load and validate the shipped data files once per process."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from infra.data.models import BootTimes, Catalog, Compatibility, ServicePrices
from infra.errors.problems import spec_error_from_validation

DATA_DIR = Path(__file__).resolve().parent
CATALOG_FILE = DATA_DIR / "gpu_catalog.yaml"
COMPATIBILITY_FILE = DATA_DIR / "compatibility.yaml"
BOOT_TIMES_FILE = DATA_DIR / "boot_times.yaml"
SERVICE_PRICES_FILE = DATA_DIR / "service_prices.yaml"

_M = TypeVar("_M", bound=BaseModel)


def load_data_file(path: Path, model: type[_M]) -> _M:
    from infra.errors import SpecError

    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise SpecError(f"{path}: cannot read data file ({exc.strerror})") from exc
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: not valid YAML: {exc}") from exc
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise spec_error_from_validation(path, path.stem, exc) from exc


@cache
def catalog() -> Catalog:
    return load_data_file(CATALOG_FILE, Catalog)


@cache
def compatibility() -> Compatibility:
    return load_data_file(COMPATIBILITY_FILE, Compatibility)


@cache
def boot_times() -> BootTimes:
    return load_data_file(BOOT_TIMES_FILE, BootTimes)


@cache
def service_prices() -> ServicePrices:
    return load_data_file(SERVICE_PRICES_FILE, ServicePrices)
