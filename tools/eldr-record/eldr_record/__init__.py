"""eldr-record: records an eldr-trace of your own MoE model from a running vLLM (see recorder)."""
from .recorder import main  # noqa: F401
