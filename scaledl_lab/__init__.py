"""scaledl_lab: the techniques of "Deep Learning at Scale" (PDP 2019) on Dask and PyTorch."""

from .config import ExperimentConfig, is_quick, quick
from .errors import ConfigError, DivergenceError, RunError, ServerLostError, WorkerLostError
from .experiment import Results, compare, run
from .viz import plots, static, style

static.install_in_kernel()  # in a notebook: every widget also leaves a static figure
style.apply_in_kernel()  # in a notebook: every figure at the lab's resolution

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "DivergenceError",
    "ExperimentConfig",
    "Results",
    "RunError",
    "ServerLostError",
    "WorkerLostError",
    "compare",
    "is_quick",
    "plots",
    "quick",
    "run",
]
