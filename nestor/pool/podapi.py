"""The narrow surface nestor needs from a GPU-pod cloud, and its Runpod implementation.

The provisioner only ever calls these five methods, so a test can stand in for the cloud with an
in-process object and the real adapter stays a thin translation onto the `runpod` SDK.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Protocol

# Pod states as Runpod reports them in `desiredStatus`; anything else counts as alive.
DEAD_STATES = frozenset({"EXITED", "TERMINATED", "DEAD", "FAILED"})


class PodApiError(RuntimeError):
    """The cloud refused or failed a call; the message says what to fix."""


class StockOutError(PodApiError):
    """No machine of the requested GPU type is free right now: try the next type."""


@dataclass(frozen=True)
class PodSpec:
    name: str
    gpu_type_id: str
    image: str
    docker_args: str = ""
    env: dict[str, str] = field(default_factory=dict)
    cloud_type: str = "ALL"  # ALL | SECURE | COMMUNITY
    container_disk_gb: int = 40
    volume_gb: int = 0
    ports: str | None = None


@dataclass(frozen=True)
class Pod:
    id: str
    name: str
    gpu_type_id: str | None = None
    status: str = "RUNNING"
    cost_per_hr: float | None = None
    uptime_s: float | None = None
    ready: bool = True  # the container is up (Runpod reports a runtime); False while booting

    @property
    def alive(self) -> bool:
        return self.status.upper() not in DEAD_STATES


@dataclass(frozen=True)
class GpuStock:
    gpu_type_id: str
    available: bool
    level: str | None = None  # Runpod's stockStatus: High / Medium / Low, None when out
    price_per_hr: float | None = None


class PodApi(Protocol):
    def create(self, spec: PodSpec) -> Pod: ...

    def list(self) -> list[Pod]: ...

    def get(self, pod_id: str) -> Pod | None: ...

    def terminate(self, pod_id: str) -> None: ...

    def gpu_stock(self, gpu_type_ids: list[str]) -> dict[str, GpuStock]: ...


# Substrings of Runpod's error text when a GPU type has no free machine.
_STOCK_OUT_MARKERS = ("no longer any instances available", "not enough free gpus",
                      "no instances available", "out of stock")


def _gql_str(text: str) -> str:
    """The SDK pastes strings into GraphQL between double quotes without escaping them."""
    if '"' in text or "\\" in text or "\n" in text:
        raise PodApiError(f"value {text[:40]!r}… contains a quote, backslash or newline, which the "
                          "runpod SDK cannot send; the bootstrap passes such text base64-encoded")
    return text


def _stock_query(gpu_type_id: str, gpu_count: int) -> str:
    return f"""
    query GpuStock {{
      gpuTypes(input: {{id: "{_gql_str(gpu_type_id)}"}}) {{
        id
        securePrice
        communityPrice
        lowestPrice(input: {{gpuCount: {gpu_count}}}) {{
          uninterruptablePrice
          stockStatus
        }}
      }}
    }}
    """


class RunpodApi:
    """PodApi on the `runpod` SDK (GraphQL at api.runpod.io, or $RUNPOD_API_BASE_URL)."""

    def __init__(self, api_key: str | None = None, gpu_count: int = 1):
        import runpod

        key = api_key or os.environ.get("RUNPOD_API_KEY") or runpod.api_key
        if not key:
            raise PodApiError("no Runpod API key: set RUNPOD_API_KEY or run `runpod config`")
        runpod.api_key = key  # terminate_pod() only reads the module-level key
        self._rp = runpod
        self.gpu_count = gpu_count

    def _call(self, fn, *args, **kwargs):
        from runpod import error

        try:
            return fn(*args, **kwargs)
        except error.AuthenticationError as exc:
            raise PodApiError(f"Runpod refused the API key: {exc}") from None
        except error.QueryError as exc:
            text = str(exc)
            if any(m in text.lower() for m in _STOCK_OUT_MARKERS):
                raise StockOutError(text) from None
            raise PodApiError(f"Runpod: {text}") from None
        except ValueError as exc:  # the SDK's own checks, e.g. an unknown GPU type id
            raise PodApiError(f"Runpod: {exc}") from None
        except OSError as exc:  # requests' connection errors subclass OSError
            raise PodApiError(f"cannot reach Runpod: {exc}") from None

    def create(self, spec: PodSpec) -> Pod:
        for value in (spec.name, spec.image, spec.docker_args, *spec.env.values()):
            _gql_str(value)
        raw = self._call(
            self._rp.create_pod, spec.name, image_name=spec.image, gpu_type_id=spec.gpu_type_id,
            cloud_type=spec.cloud_type, gpu_count=self.gpu_count, volume_in_gb=spec.volume_gb,
            container_disk_in_gb=spec.container_disk_gb, docker_args=spec.docker_args,
            env=spec.env or None, ports=spec.ports)
        if not raw or not raw.get("id"):
            raise StockOutError(f"Runpod deployed nothing for {spec.gpu_type_id}")
        return Pod(id=raw["id"], name=spec.name, gpu_type_id=spec.gpu_type_id, status="CREATED",
                   ready=False)

    def list(self) -> list[Pod]:
        return [self._pod(p) for p in self._call(self._rp.get_pods) or []]

    def get(self, pod_id: str) -> Pod | None:
        raw = self._call(self._rp.get_pod, pod_id)
        return self._pod(raw) if raw else None

    def terminate(self, pod_id: str) -> None:
        self._call(self._rp.terminate_pod, pod_id)

    def gpu_stock(self, gpu_type_ids: list[str]) -> dict[str, GpuStock]:
        from runpod.api.graphql import run_graphql_query

        out = {}
        for gid in gpu_type_ids:
            rows = self._call(run_graphql_query, _stock_query(gid, self.gpu_count))
            rows = rows["data"]["gpuTypes"]
            if not rows:
                raise PodApiError(f"Runpod has no GPU type {gid!r}; see runpod.get_gpus()")
            row = rows[0]
            lowest = row.get("lowestPrice") or {}
            level = lowest.get("stockStatus")
            price = lowest.get("uninterruptablePrice") or row.get("securePrice")
            out[gid] = GpuStock(gid, available=bool(level), level=level, price_per_hr=price)
        return out

    @staticmethod
    def _pod(raw: dict) -> Pod:
        machine = raw.get("machine") or {}
        return Pod(id=raw["id"], name=raw.get("name") or "",
                   gpu_type_id=machine.get("gpuDisplayName"),
                   status=(raw.get("desiredStatus") or "UNKNOWN").upper(),
                   cost_per_hr=raw.get("costPerHr"), uptime_s=raw.get("uptimeSeconds"),
                   ready=raw.get("runtime") is not None)
