"""Data loading and RL data curation: spec-driven loaders, the curation funnel
and the evaluation benchmarks bundled under data/eval/.

The package imports none of its modules up front: a stage that needs one loader should not load pandas and
datasketch (seconds) through the others and the near-dedupe. Answer extraction and the integer rules live in
``rstar2.grading.answers`` (the grader and gold curation share them; data imports grading, never the reverse).
The names below are resolved from their modules on first use. The curation function itself is
``rstar2.data.curate.curate``: as a package attribute, ``curate`` would be the function or the submodule
depending on what was imported first.
"""

from importlib import import_module

_EXPORTS = {
    "DEFAULT_BENCHMARKS": "benchmarks", "load_benchmark": "benchmarks",
    "format_funnel": "curate", "funnel_table": "curate",
    "BUNDLED_SOURCES": "loaders", "WORKING_DIR": "loaders", "load_source": "loaders", "resolve_path": "loaders",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'rstar2.data' has no attribute {name!r}")
    return getattr(import_module(f"rstar2.data.{_EXPORTS[name]}"), name)
