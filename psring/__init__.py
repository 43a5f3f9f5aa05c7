"""psring: parameter server vs ring all-reduce, one trainer, one ``Synchronizer`` interface."""
__version__ = "0.1.0"


def __getattr__(name: str):
    """``psring.DistributedOptimizer`` without importing torch for ``import psring`` alone."""
    if name == "DistributedOptimizer":
        from .distributed_optimizer import DistributedOptimizer

        return DistributedOptimizer
    raise AttributeError(f"module 'psring' has no attribute {name!r}")
