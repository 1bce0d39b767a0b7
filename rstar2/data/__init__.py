"""Data loading and RL data curation: spec-driven loaders, integer-answer normalisation, the curation funnel
and the evaluation benchmarks bundled under data/eval/."""

from rstar2.data.answers import classify_integer_answer, last_boxed, normalize_integer_answer
from rstar2.data.benchmarks import DEFAULT_BENCHMARKS, load_benchmark
from rstar2.data.curate import curate, format_funnel, funnel_table
from rstar2.data.loaders import BUNDLED_SOURCES, REPO_ROOT, load_source, resolve_path

__all__ = [
    "BUNDLED_SOURCES", "DEFAULT_BENCHMARKS", "REPO_ROOT", "classify_integer_answer", "curate", "format_funnel",
    "funnel_table", "last_boxed", "load_benchmark", "load_source", "normalize_integer_answer", "resolve_path",
]
