"""Where jobs run: the Pool protocol, local worker processes, Ray actors, cost-aware dispatch.

Backends are imported lazily by `make_pool`, so importing this package never imports Ray.
"""

from nestor.pool.base import Pool, PoolError, make_pool
from nestor.pool.config import PoolConfig, PoolConfigError, WorkerType, load_pool_config
from nestor.pool.cost import CostMatrix, MatrixEntry

__all__ = ["CostMatrix", "MatrixEntry", "Pool", "PoolConfig", "PoolConfigError", "PoolError",
           "WorkerType", "load_pool_config", "make_pool"]
