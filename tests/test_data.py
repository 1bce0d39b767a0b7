"""Tests for rstar2.data (loaders, integer answers, curation, benchmarks) and the rl_data stage. All fast (CPU)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pandas as pd
import pytest

from rstar2.data import BUNDLED_SOURCES, DEFAULT_BENCHMARKS, WORKING_DIR, load_benchmark, load_source
from rstar2.grading.answers import classify_integer_answer, last_boxed, normalize_integer_answer
from rstar2.data.curate import curate
from rstar2.io import read_json, read_jsonl
from rstar2.stages import rl_candidates
from conftest import stage_params


def _rl_data(seed: int = 0, **section):
    """rl_candidates params as the workflow builds them from config.yaml with ``section`` set in ``rl_data``."""
    return stage_params("rl_data", overrides={"seed": seed, "rl_data": section}, files=())

# ----------------------------------------------------------------------------------------------------------
# normalize_integer_answer: every rule in its docstring


@pytest.mark.parametrize("raw, expected", [
    ("12", 12), ("-7", -7), ("+3", 3),
    ("042", 42), ("-0", 0), ("000", 0),
    ("1,000", 1000), ("1 000", 1000), ("12,345,678", 12345678), ("1{,}000", 1000), ("1\\,000", 1000), ("112,\\!875", 112875),
    ("1{,}008{,}016", 1008016),
    ("27.0", 27), ("10.00", 10), ("27.", 27), ("1,000.0", 1000),
    ("\\boxed{12}", 12), ("\\fbox{12}", 12), ("\\text{12}", 12), ("\\textbf{7}", 7), ("\\mathbf{2340}", 2340),
    ("\\mathrm{5}", 5), ("\\textrm{5}", 5), ("\\displaystyle 9", 9), ("{12}", 12),
    ("$12$", 12), ("$$12$$", 12), ("\\(12\\)", 12), ("\\[12\\]", 12), ("$\\boxed{12}$", 12),
    ("\\boxed{\\text{12}}.", 12),
    ("\u221212", -12), ("$\u22125$", -5),
    ("  12  ", 12), ("\n12\t", 12), ("- 5", -5), ("12.", 12), ("\\boxed{12}.", 12),
    ("73^\\circ", 73), ("50^{\\circ}", 50), ("30°", 30), ("30^\\circ.", 30),
    ("\\$42409", 42409), ("\\$ 1500", 1500), ("\\$1,\\!657", 1657),
    (60, 60), (27.0, 27),
])
def test_integer_answers_accepted(raw, expected):
    assert normalize_integer_answer(raw) == expected


@pytest.mark.parametrize("raw, reason", [
    (None, "no_answer"), ("", "no_answer"), ("   ", "no_answer"), (float("nan"), "no_answer"),
    ("3.5", "non_integer_number"), ("0.20", "non_integer_number"), (".3", "non_integer_number"),
    ("\\frac{1}{2}", "non_integer_number"), ("\\dfrac{4}{2}", "non_integer_number"),
    ("-5/4", "non_integer_number"), (3.5, "non_integer_number"), ("\\$ 251.60", "non_integer_number"),
    ("0,1", "tuple_or_list"), ("12,34", "tuple_or_list"), ("3, 5, 7", "tuple_or_list"), ("(0,1)", "tuple_or_list"),
    ("0,100", "tuple_or_list"), ("1,0000", "tuple_or_list"), ("5,\\,-11", "tuple_or_list"),
    ("\\{4,5,7\\}", "tuple_or_list"),
    ("2^{10}", "not_a_number"), ("3\\sqrt2", "not_a_number"), ("2^{100} - 2", "not_a_number"),
    ("1e5", "not_a_number"), ("12_5", "not_a_number"), ("24_{10}", "not_a_number"),
    ("x=5", "not_a_number"), ("AB=9, CD=4", "not_a_number"), ("does not exist", "not_a_number"),
    ("20\\%", "not_a_number"), ("\\boxed{1}, \\boxed{2}", "not_a_number"), ("$1$ and $2$", "not_a_number"),
    ("\\text{(C)}", "not_a_number"), ("12 34", "tuple_or_list"), (True, "not_a_number"),
])
def test_integer_answers_rejected(raw, reason):
    assert normalize_integer_answer(raw) is None
    assert classify_integer_answer(raw) == (None, reason)


def test_huge_answers_in_scientific_notation_are_too_large_and_the_bound_is_a_parameter():
    # Spec §5.3: Project Euler answers like 6.5e27330467 time out verifiers and are dropped.
    assert classify_integer_answer("6.5e27330467", max_abs=10**9) == (None, "too_large")
    assert classify_integer_answer("3\\times 10^{20}", max_abs=10**9) == (None, "too_large")
    assert classify_integer_answer("1e5", max_abs=10**9) == (None, "not_a_number")  # small: still not canonical
    assert classify_integer_answer("123456789012", max_abs=10**9) == (None, "too_large")
    assert classify_integer_answer("123456789012", max_abs=10**12) == (123456789012, "ok")


def test_max_abs_is_inclusive_and_applies_to_negatives():
    assert normalize_integer_answer("1000", max_abs=1000) == 1000
    assert normalize_integer_answer("-1000", max_abs=1000) == -1000
    assert normalize_integer_answer("1001", max_abs=1000) is None
    assert classify_integer_answer("-1,001", max_abs=1000) == (None, "too_large")
    assert classify_integer_answer(str(10**19)) == (None, "too_large")  # default max_abs is 10**18


def test_last_boxed():
    assert last_boxed("first \\boxed{1}, then \\boxed{\\frac{1}{2}}.") == "\\frac{1}{2}"
    assert last_boxed("so \\boxed 5.") == "5"
    assert last_boxed("no box here") is None
    assert last_boxed(None) is None


# ----------------------------------------------------------------------------------------------------------
# Case G06: commas and tuples


def test_g06_commas_only_as_thousands_groups():
    # Golds from the case: "1,000" / "1{,}000" are 1000; "0,1" stays a tuple (never "01" or 1); "12,34" is not 1234.
    assert normalize_integer_answer("1,000") == 1000
    assert normalize_integer_answer("1{,}000") == 1000
    assert normalize_integer_answer("0,1") is None
    assert normalize_integer_answer("12,34") is None
    assert normalize_integer_answer("3, 5, 7") is None
    assert normalize_integer_answer("\\boxed{1,000}") == 1000
    assert normalize_integer_answer("\\boxed{12,34}") is None


def test_g06_tuple_golds_are_dropped_not_fused_by_curation(tmp_path):
    csv = tmp_path / "g06.csv"
    pd.DataFrame({"q": [f"Problem number {i} about commas." for i in range(5)],
                  "gold": ["0,1", "1,000", "1{,}000", "12,34", "3,5,7"]}).to_csv(csv, index=False)
    rows, funnel = curate([{"name": "g06", "path": str(csv), "fields": {"problem": "q", "answer": "gold"}}],
                          {}, max_abs_answer=10**9)
    assert [(r["answer_raw"], r["answer"]) for r in rows] == [("1,000", "1000"), ("1{,}000", "1000")]
    assert funnel["drops"] == {"tuple_or_list": 3}


# ----------------------------------------------------------------------------------------------------------
# Case P04: custom dataset with missing or renamed fields

P04_ROWS = [
    {"prompt": [{"role": "user", "content": "What is 2+3?"}], "data_source": "",
     "reward_model": {"ground_truth": "5"}},
    {"prompt": [{"role": "user", "content": "What is 2+3?"}], "answer": "5"},
    {"problem": "What is 2+3?", "solution": "Adding gives \\boxed{5}."},
]


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_p04_missing_nested_field_fails_up_front_naming_rows(tmp_path):
    path = _write_jsonl(tmp_path / "p04.jsonl", P04_ROWS)
    spec = {"name": "p04_verl", "path": str(path),
            "fields": {"problem": "prompt", "answer": "reward_model.ground_truth"}}
    with pytest.raises(ValueError) as err:
        load_source(spec)
    msg = str(err.value)
    assert "p04_verl" in msg and str(path) in msg
    assert "row 1: missing field 'reward_model.ground_truth'" in msg and "rows 1, 2" in msg
    assert "row 2: missing field 'prompt'" in msg
    assert "available columns" in msg and "solution" in msg


def test_p04_empty_dataset_name_is_rejected(tmp_path):
    path = _write_jsonl(tmp_path / "p04.jsonl", P04_ROWS[:1])
    with pytest.raises(ValueError, match="non-empty 'name'"):
        load_source({"name": "", "path": str(path), "fields": {"problem": "prompt", "answer": "answer"}})


def test_p04_each_row_loads_through_an_explicit_mapping(tmp_path):
    row0 = load_source({"name": "verl", "path": str(_write_jsonl(tmp_path / "a.jsonl", P04_ROWS[:1])),
                        "fields": {"problem": "prompt", "answer": "reward_model.ground_truth"}})
    row1 = load_source({"name": "flat", "path": str(_write_jsonl(tmp_path / "b.jsonl", P04_ROWS[1:2])),
                        "fields": {"problem": "prompt.0.content", "answer": "answer"}})
    spec2 = {"name": "math_style", "path": str(_write_jsonl(tmp_path / "c.jsonl", P04_ROWS[2:])),
             "fields": {"problem": "problem", "answer": "solution"}}
    row2 = load_source({**spec2, "answer_from_boxed": True})
    for rows in (row0, row1, row2):
        assert [(r["problem"], r["answer_raw"]) for r in rows] == [("What is 2+3?", "5")]
    # Without the explicit boxed mapping the solution text is not a gold: curation drops it, never guesses.
    rows, funnel = curate([spec2], {}, max_abs_answer=1000)
    assert rows == [] and funnel["drops"] == {"not_a_number": 1}


# ----------------------------------------------------------------------------------------------------------
# Loader: custom files, formats, errors


def test_custom_csv_with_other_column_names_through_a_spec(tmp_path):
    csv = tmp_path / "custom.csv"
    pd.DataFrame({
        "Question": ["How many sides does a hexagon have? Count them all carefully.",
                     "Compute one thousand written with a comma, as in the usual style.",
                     "Ce problème est en français et doit être filtré.",
                     "What is one half as a fraction in lowest terms please?"],
        "Gold": ["006", "1,000", "7", "\\frac{1}{2}"],
        "uid": ["a", "b", "c", "d"],
        "language": ["en", "en", "fr", "en"],
    }).to_csv(csv, index=False)
    spec = {"name": "custom", "path": str(csv), "fields": {"problem": "Question", "answer": "Gold", "id": "uid"},
            "filters": {"language": "en"}}
    loaded = load_source(spec)
    assert [r["id"] for r in loaded] == ["custom-a", "custom-b", "custom-d"]
    assert loaded[0]["answer_raw"] == "006"  # read as text: no dtype guessing turns "006" into 6
    out = tmp_path / "out"
    # the fraction is dropped on purpose (the integer filter), so the source may lose it (rl_data.max_filtered_share)
    rl_candidates.run(_rl_data(sources=[spec], decontaminate_against=["aime24"], ngram=8, max_abs_answer=10**6,
                               max_filtered_share={"custom": 1.0}), str(out))
    train = read_jsonl(out / "train.jsonl")
    assert [(r["id"], r["answer"]) for r in train] == [("custom-a", "6"), ("custom-b", "1000")]
    assert (out / "funnel.csv").read_text().splitlines() == [
        "source,loaded,integer_answer,dedupe,near_dedupe,decontaminate,dropped:non_integer_number",
        "custom,3,2,2,2,2,1", "total,3,2,2,2,2,1"]
    assert (out / "funnel.png").stat().st_size > 1000
    manifest = read_json(out / "manifest.json")
    assert manifest["stage"] == "rl_data" and manifest["counts"]["rows"] == 2
    assert str(csv) in manifest["inputs"]
    assert read_json(out / "funnel.json")["drops"] == {"non_integer_number": 1}


def test_missing_field_error_names_dataset_file_row_and_field(tmp_path):
    csv = tmp_path / "renamed.csv"
    pd.DataFrame({"question": ["What is 1+1?"], "gold": ["2"]}).to_csv(csv, index=False)
    with pytest.raises(ValueError) as err:
        load_source({"name": "renamed", "path": str(csv), "fields": {"problem": "question", "answer": "answer"}})
    msg = str(err.value)
    for part in ("dataset 'renamed'", str(csv), "row 0", "missing field 'answer'", "['question', 'gold']"):
        assert part in msg, (part, msg)


def test_null_values_error_by_default_and_count_as_drops_with_on_missing_drop(tmp_path):
    path = _write_jsonl(tmp_path / "nulls.jsonl", [{"q": "What is one plus one, in total?", "a": "2"},
                                                   {"q": "What is two plus two, in total?", "a": None}])
    spec = {"name": "nulls", "path": str(path), "fields": {"problem": "q", "answer": "a"}}
    with pytest.raises(ValueError, match="row 1: missing field 'a'"):
        load_source(spec)
    rows, funnel = curate([{**spec, "on_missing": "drop"}], {}, max_abs_answer=10)
    assert [r["answer"] for r in rows] == ["2"] and funnel["drops"] == {"no_answer": 1}


def test_missing_file_names_the_dataset(tmp_path):
    with pytest.raises(FileNotFoundError, match="dataset 'ghost'"):
        load_source({"name": "ghost", "path": str(tmp_path / "nope.jsonl"),
                     "fields": {"problem": "p", "answer": "a"}})


def test_missing_filter_column_is_an_error(tmp_path):
    path = _write_jsonl(tmp_path / "x.jsonl", [{"p": "x", "a": "1"}])
    with pytest.raises(ValueError, match="filter column 'lang'"):
        load_source({"name": "x", "path": str(path), "fields": {"problem": "p", "answer": "a"},
                     "filters": {"lang": "en"}})


def test_json_array_json_lines_in_a_json_file_parquet_and_limit(tmp_path):
    rows = [{"p": f"problem {i}", "a": f"00{i}"} for i in range(4)]
    (tmp_path / "arr.json").write_text(json.dumps(rows))
    _write_jsonl(tmp_path / "lines.json", rows)
    pd.DataFrame(rows).to_parquet(tmp_path / "t.parquet")
    fields = {"problem": "p", "answer": "a"}
    for name in ("arr.json", "lines.json", "t.parquet"):
        got = load_source({"name": "n", "path": name, "fields": fields, "limit": 3}, base_dir=tmp_path)
        assert [(r["id"], r["answer_raw"]) for r in got] == [("n-0", "000"), ("n-1", "001"), ("n-2", "002")]
    with pytest.raises(ValueError, match="cannot infer the format"):
        (tmp_path / "x.txt").write_text("")
        load_source({"name": "n", "path": "x.txt", "fields": fields}, base_dir=tmp_path)


def test_duplicate_ids_are_an_error(tmp_path):
    path = _write_jsonl(tmp_path / "d.jsonl", [{"i": 1, "p": "x", "a": "1"}, {"i": 1, "p": "y", "a": "2"}])
    with pytest.raises(ValueError, match="duplicate id 'd-1'"):
        load_source({"name": "d", "path": str(path), "fields": {"problem": "p", "answer": "a", "id": "i"}})


def test_bundled_dapo_parquet_nested_fields_and_language_filter():
    rows = load_source(next(s for s in BUNDLED_SOURCES if s["name"] == "dapo_math_17k"))
    assert len(rows) == 14485  # English subset (SOURCE.md)
    assert rows[0]["id"] == "dapo_math_17k-0" and rows[0]["answer_raw"] == "34"
    assert rows[0]["problem"].startswith("In triangle $ABC$")


# ----------------------------------------------------------------------------------------------------------
# Benchmarks


def test_benchmarks_load_with_canonical_integer_answers():
    sizes = {name: len(load_benchmark(name)) for name in DEFAULT_BENCHMARKS}
    assert sizes == {"aime24": 30, "aime25": 30, "amc23": 40, "math500": 500}
    aime24 = load_benchmark("aime24", DEFAULT_BENCHMARKS["aime24"])
    assert all(r["answer"] == str(int(r["answer"])) for r in aime24)  # "025" -> "25"
    assert {"id", "problem", "answer"} <= set(aime24[0])
    amc = load_benchmark("amc23")
    assert amc[0]["answer"] == "27" and amc[0]["answer_raw"] == "27.0"
    math500 = {r["id"]: r["answer"] for r in load_benchmark("math500")}
    assert math500["math500-test/precalculus/807.json"] == "\\left( 3, \\frac{\\pi}{2} \\right)"


# ----------------------------------------------------------------------------------------------------------
# Full curation on the bundled pool: decontamination checked independently


def _independent_8grams(text: str) -> set[tuple[str, ...]]:
    # Same definition as the spec (lowercase, every non-alphanumeric char is a separator), written differently:
    # str.isalnum per character instead of a regex, raw tuples instead of hashes.
    words = "".join(ch if ch.isalnum() else " " for ch in text.lower()).split()
    return {tuple(words[i:i + 8]) for i in range(len(words) - 7)}


def test_full_curation_is_decontaminated_against_all_benchmarks():
    bench_files = {"aime24": "data/eval/aime24/test.jsonl", "aime25": "data/eval/aime25/aime_2025.jsonl",
                   "amc23": "data/eval/amc23/test.jsonl", "math500": "data/eval/math500/test.jsonl"}
    bench_grams: set[tuple[str, ...]] = set()
    for rel in bench_files.values():
        with open(WORKING_DIR / rel, encoding="utf-8") as f:
            for line in f:
                bench_grams |= _independent_8grams(json.loads(line)["problem"])

    t0 = time.time()
    benchmarks = {name: load_benchmark(name) for name in bench_files}
    rows, funnel = curate(BUNDLED_SOURCES, benchmarks, ngram=8, max_abs_answer=10**9)
    wall = time.time() - t0
    assert funnel["drops"]["near_duplicate"] > 0 and funnel["step_status"]["near_dedupe"] == "done"
    print(f"\ncurate on the bundled pool: {funnel['total']['loaded']} -> {len(rows)} rows in {wall:.2f}s")
    assert wall < 60

    leaked = [r["id"] for r in rows if _independent_8grams(r["problem"]) & bench_grams]
    assert leaked == []
    assert all(funnel["decontamination"][b] > 0 for b in bench_files)  # each benchmark did remove something

    # Output shape and invariants.
    assert len({r["id"] for r in rows}) == len(rows)
    assert len({" ".join(r["problem"].lower().split()) for r in rows}) == len(rows)
    assert all(r["answer"] == str(int(r["answer"])) and abs(int(r["answer"])) <= 10**9 for r in rows)
    assert set(rows[0]) == {"id", "source", "problem", "answer", "answer_raw", "answer_type"}
    # Funnel bookkeeping: counts never grow, totals add up, every drop has a reason.
    for src, per_step in funnel["per_source"].items():
        counts = [per_step[s] for s in funnel["steps"]]
        assert counts == sorted(counts, reverse=True), src
    assert sum(funnel["drops"].values()) == funnel["total"]["loaded"] - len(rows)
    assert funnel["total"]["decontaminate"] == len(rows)


def test_rl_data_limit_is_a_seeded_sample(tmp_path):
    csv = tmp_path / "many.csv"
    pd.DataFrame({"q": [f"Distinct problem number {i} of the set." for i in range(50)],
                  "a": [str(i) for i in range(50)]}).to_csv(csv, index=False)
    params = _rl_data(sources=[{"name": "many", "path": str(csv), "fields": {"problem": "q", "answer": "a"}}],
                      decontaminate_against=[], max_abs_answer=100, limit=10, seed=3)
    rl_candidates.run(params, str(tmp_path / "a"))
    rl_candidates.run(params, str(tmp_path / "b"))
    a, b = read_jsonl(tmp_path / "a" / "train.jsonl"), read_jsonl(tmp_path / "b" / "train.jsonl")
    assert a == b and len(a) == 10
    assert [r["id"] for r in a] != [f"many-{i}" for i in range(10)]  # shuffled, not the head
    funnel = read_json(tmp_path / "a" / "funnel.json")
    assert funnel["steps"][-1] == "limit" and funnel["drops"]["over_limit"] == 40


def test_rl_data_rejects_unknown_benchmark(tmp_path):
    with pytest.raises(ValueError, match="unknown benchmarks"):
        params = _rl_data(sources=[{"name": "x", "path": "x.csv", "fields": {"problem": "p", "answer": "a"}}],
                          decontaminate_against=[], max_abs_answer=10)
        rl_candidates.run({**params, "decontaminate_against": ["hmmt25"]}, str(tmp_path))


# ----------------------------------------------------------------------------------------------------------
# Near-duplicates, boilerplate exemption, optional fields


from rstar2.data.curate import tokens  # noqa: E402
from rstar2.data.near_dedupe import near_duplicates  # noqa: E402

_BASE = ("Let $S$ be the set of all positive integers $n$ such that $n^2 + 12n - 2007$ is a perfect square. "
         "Find the remainder when the sum of all elements of $S$ is divided by one thousand, and explain briefly.")


def test_near_duplicates_catch_rewordings_but_keep_other_numbers():
    # Same problem, missed by exact dedupe: LaTeX markup dropped and a word added (Jaccard of 5-shingles ~0.97).
    reworded = _BASE.replace("$S$", "S").replace("briefly.", "briefly please.")
    other_numbers = _BASE.replace("12n - 2007", "14n - 1999")  # same template, a different problem (~0.7)
    unrelated = "How many positive divisors does 2024 have in total, counting one and the number itself?"
    docs = [tokens(t) for t in (_BASE, reworded, other_numbers, unrelated, reworded)]
    assert near_duplicates(docs, threshold=0.9) == [None, 0, None, None, 0]
    assert near_duplicates(docs, threshold=0.5) == [None, 0, 0, None, 0]
    with pytest.raises(ValueError, match="threshold"):
        near_duplicates(docs, threshold=0)


def test_near_duplicates_are_a_funnel_step_with_answer_conflicts_and_can_be_skipped(tmp_path):
    csv = tmp_path / "near.csv"
    reworded = _BASE.replace("$S$", "S")
    pd.DataFrame({"q": [_BASE, reworded, reworded.replace("briefly.", "briefly please.")],
                  "a": ["7", "7", "8"]}).to_csv(csv, index=False)
    spec = {"name": "near", "path": str(csv), "fields": {"problem": "q", "answer": "a"}}
    rows, funnel = curate([spec], {}, max_abs_answer=100)
    assert [r["id"] for r in rows] == ["near-0"]
    assert funnel["drops"] == {"near_duplicate": 2} and funnel["near_duplicate_answer_conflicts"] == 1
    assert funnel["per_source"]["near"] == {"loaded": 3, "integer_answer": 3, "dedupe": 3, "near_dedupe": 1,
                                            "decontaminate": 1}
    assert funnel["step_status"]["near_dedupe"] == "done"
    rows, funnel = curate([spec], {}, max_abs_answer=100, near_dedupe={"enabled": False})
    assert len(rows) == 3 and funnel["step_status"]["near_dedupe"] == "skipped"
    with pytest.raises(ValueError, match="unknown settings"):
        curate([spec], {}, max_abs_answer=100, near_dedupe={"treshold": 0.5})


def test_boilerplate_exemption_is_off_by_default_and_still_catches_copies(tmp_path):
    stock = "where m and n are relatively prime positive integers find m n"
    bench = {"bench": [{"problem": f"The probability that a fair coin lands heads twice is m/n, {stock}."}]}
    pool = [f"A bag holds {i} red and {i + 3} blue marbles; the chance of drawing two reds is m/n, {stock}."
            for i in range(4)]
    pool.append(bench["bench"][0]["problem"].replace("fair coin", "fair  coin"))  # a real copy
    csv = tmp_path / "pool.csv"
    pd.DataFrame({"q": pool, "a": [str(i) for i in range(5)]}).to_csv(csv, index=False)
    spec = {"name": "pool", "path": str(csv), "fields": {"problem": "q", "answer": "a"}}
    off = {"enabled": False}
    rows, funnel = curate([spec], bench, max_abs_answer=100, near_dedupe=off)
    assert rows == [] and funnel["decontamination"] == {"bench": 5}  # the paper's rule: stock phrasing drops all
    assert funnel["boilerplate_exemption"] == {"min_problems": 0, "exempt_ngrams": 0, "rows_kept": 0}
    rows, funnel = curate([spec], bench, max_abs_answer=100, near_dedupe=off, boilerplate_min_problems=3)
    assert [r["id"] for r in rows] == ["pool-0", "pool-1", "pool-2", "pool-3"]
    assert funnel["decontamination"] == {"bench": 1}  # the copy shares its specific n-grams too
    assert funnel["boilerplate_exemption"]["rows_kept"] == 4 and funnel["boilerplate_exemption"]["exempt_ngrams"] > 0


def test_optional_source_and_language_fields_are_carried_and_required_when_mapped(tmp_path):
    path = _write_jsonl(tmp_path / "omr.jsonl", [
        {"problem": "What is two plus five?", "expected_answer": "7", "problem_source": "aops_forum", "lang": "en"},
        {"problem": "Combien font deux plus deux ?", "expected_answer": "4", "problem_source": "aops_forum",
         "lang": "fr"}])
    spec = {"name": "omr", "path": str(path), "fields": {"problem": "problem", "answer": "expected_answer",
                                                           "source": "problem_source", "language": "lang"},
            "filters": {"lang": "en"}}
    rows, _ = curate([spec], {}, max_abs_answer=100)
    assert rows == [{"id": "omr-0", "source": "omr", "problem": "What is two plus five?", "answer": "7",
                     "answer_raw": "7", "answer_type": "integer", "origin": "aops_forum", "language": "en"}]
    with pytest.raises(ValueError, match="row 0: missing field 'subset'"):
        load_source({**spec, "fields": {**spec["fields"], "source": "subset"}})


def test_a_broken_json_line_is_named_with_file_and_line(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text('{"id": 1, "problem": "a", "answer": "1"}\n\n{"id": 2, "problem": "b, "answer": "2"}\n')
    with pytest.raises(ValueError, match=r"dataset 'd' \(file .*d\.jsonl\): line 3 \(1-based\) is not valid JSON"):
        load_source({"name": "d", "path": str(p), "fields": {"problem": "problem", "answer": "answer"}})
    # the decoder's own position counts inside that one line: a column, not a contradicting "line 2"
    p.write_text('{"id": 1, "problem": "a", "answer": "1"}\n{\n')
    with pytest.raises(ValueError, match=r"line 2 \(1-based\) is not valid JSON: Expecting property name enclosed "
                                         r"in double quotes at column 2$"):
        load_source({"name": "d", "path": str(p), "fields": {"problem": "problem", "answer": "answer"}})


# ----------------------------------------------------------------------------------------------------------
# Prompt-length filter (rl_data.max_prompt_tokens; the released code drops prompts over 2048 tokens)

def _pair_at_the_boundary(tok, tool):
    """Two problems whose rendered prompts are L and exactly L + 1 tokens long."""
    from rstar2.data.prompt_length import prompt_lengths

    short = "How many positive divisors does 2024 have?"
    (n,) = prompt_lengths([short], tok, tool)
    for word in ("x", " x", "!", " a", "s"):
        longer = short + word
        if prompt_lengths([longer], tok, tool) == [n + 1]:
            return short, longer, n
    raise AssertionError("no one-token extension found")


def test_prompt_length_counts_the_prompt_a_rollout_starts_from(qwen_tokenizer):
    from rstar2.data.prompt_length import prompt_lengths
    from rstar2.rollout.agent_loop import AgentLoop, RolloutConfig, ToolConfig

    tool = "python_code_with_standard_io"
    problems = ["What is $1+1$?", "Find all $x$ with $x^2 = 4$.\n\nGive the sum.", "ü" * 50, ""]
    loop = AgentLoop(qwen_tokenizer, RolloutConfig(tool=ToolConfig(name=tool)), tools=None)
    expected = [len(loop.new_trajectory({"id": str(i), "problem": p}).prompt_ids) for i, p in enumerate(problems)]
    assert prompt_lengths(problems, qwen_tokenizer, tool, batch_size=3) == expected
    # the tool schema is part of the prompt: a longer tool name costs tokens
    assert prompt_lengths(problems[:1], qwen_tokenizer, tool + "_and_more_words")[0] > expected[0]


def test_prompt_length_adds_the_system_turn_only_where_the_tokenizer_splits_there(qwen_tokenizer):
    """The system turn is tokenized once where its count adds up (Qwen's end-of-turn marker is special); a
    tokenizer that adds a token to every text does not add up there, and every prompt is then counted whole."""
    from rstar2 import chat
    from rstar2.data.prompt_length import prompt_lengths

    tool = "python_code_with_standard_io"
    tools = [chat.python_tool_schema(tool)]
    problems = [f"What is {i} + {i}?" for i in range(20)] + ["\nleading newline", " leading space", ""]
    whole = [len(qwen_tokenizer(chat.prompt_text(p, tools), add_special_tokens=False)["input_ids"]) for p in problems]
    seen = []

    class Spy:
        def __call__(self, texts, add_special_tokens):
            seen.extend(texts)
            return qwen_tokenizer(texts, add_special_tokens=add_special_tokens)

    assert prompt_lengths(problems, Spy(), tool, batch_size=7) == whole
    head = chat.turn("system", chat.system_message(tools))
    assert sum(t.startswith(head) for t in seen) == 1 + 8   # the system turn alone, then the probe's 8 prompts

    class WithStartToken:   # one extra token per text, like a tokenizer that prepends a word-start marker
        def __call__(self, texts, add_special_tokens):
            return {"input_ids": [[0] + qwen_tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]}

    assert prompt_lengths(problems, WithStartToken(), tool, batch_size=7) == [n + 1 for n in whole]
    # the default config's tool name (its schema is the system turn every default prompt opens with)
    import yaml
    default_tool = yaml.safe_load((Path(__file__).parents[1] / "config.yaml").read_text())["tool"]["name"]
    tools = [chat.python_tool_schema(default_tool)]
    assert prompt_lengths(problems, qwen_tokenizer, default_tool, batch_size=5) == [
        len(qwen_tokenizer(chat.prompt_text(p, tools), add_special_tokens=False)["input_ids"]) for p in problems]


def test_prompt_length_keeps_exactly_max_tokens_and_drops_one_more(tmp_path, qwen_tokenizer):
    from rstar2.data.curate import format_funnel
    from rstar2.stages import rl_data

    tool = {"name": "execute_python_code_with_standard_io"}
    short, longer, n = _pair_at_the_boundary(qwen_tokenizer, tool["name"])
    rows = [{"id": "p-0", "source": "pool", "problem": short, "answer": "15", "answer_raw": "15"},
            {"id": "p-1", "source": "pool", "problem": longer, "answer": "15", "answer_raw": "15"},
            {"id": "q-0", "source": "other", "problem": "Compute 2 + 2.", "answer": "4", "answer_raw": "4"}]
    data, funnel_in = tmp_path / "train.jsonl", tmp_path / "funnel.json"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    funnel_in.write_text(json.dumps({"steps": ["loaded"], "step_status": {"loaded": "done"},
                                     "per_source": {"pool": {"loaded": 2}, "other": {"loaded": 1}},
                                     "total": {"loaded": 3}, "drops": {}, "drops_per_source": {},
                                     "decontamination": {}}))
    out = tmp_path / "out"
    def params(max_tokens):
        return stage_params("label_verification", overrides={"tool": tool, "rl_data": {"max_prompt_tokens": max_tokens},
                                                             "label_verification": {"enabled": False}})
    rl_data.run(params(n), str(data), str(funnel_in), str(out), tokenizer=qwen_tokenizer)
    assert [r["id"] for r in read_jsonl(out / "train.jsonl")] == ["p-0", "q-0"]
    funnel = read_json(out / "funnel.json")
    assert funnel["steps"] == ["loaded", "prompt_length", "label_verification"]
    assert funnel["per_source"]["pool"]["prompt_length"] == 1 and funnel["total"]["prompt_length"] == 2
    assert funnel["drops"] == {"prompt_too_long": 1} and funnel["drops_per_source"]["pool"] == {"prompt_too_long": 1}
    assert funnel["prompt_length"] == {"max_tokens": n, "longest": n + 1, "dropped": 1}
    table = (out / "funnel.csv").read_text().splitlines()
    assert table[0] == "source,loaded,prompt_length,label_verification,dropped:prompt_too_long"
    assert table[1:] == ["pool,2,1,1,1", "other,1,1,1,0", "total,3,2,2,1"]
    text = format_funnel(funnel)
    assert "prompt_length" in text.splitlines()[0] and f"longest {n + 1}, limit {n}, 1 dropped" in text
    assert read_json(out / "manifest.json")["counts"]["prompt_too_long"] == 1
    # one token more allowed: nothing is dropped; no limit: the step is recorded as skipped
    rl_data.run(params(n + 1), str(data), str(funnel_in), str(tmp_path / "wide"), tokenizer=qwen_tokenizer)
    assert len(read_jsonl(tmp_path / "wide" / "train.jsonl")) == 3
    rl_data.run(params(None), str(data), str(funnel_in), str(tmp_path / "off"))
    assert read_json(tmp_path / "off" / "funnel.json")["step_status"]["prompt_length"] == "skipped"
    with pytest.raises(ValueError, match="no tokenizer folder"):
        rl_data.run(params(n), str(data), str(funnel_in), str(tmp_path / "none"))


def test_prompt_length_reads_the_tokenizer_from_the_base_model_folder(tmp_path, qwen_tokenizer):
    """The rl_data rule passes results/base_model/model (--tokenizer): a saved tokenizer folder is what it loads."""
    from rstar2.cli import main

    folder = tmp_path / "base_model"
    qwen_tokenizer.save_pretrained(folder)
    data, funnel_in = tmp_path / "train.jsonl", tmp_path / "funnel.json"
    data.write_text(json.dumps({"id": "a-0", "source": "a", "problem": "What is 3 + 4?", "answer": "7",
                                "answer_raw": "7"}) + "\n")
    funnel_in.write_text(json.dumps({"steps": ["loaded"], "step_status": {"loaded": "done"},
                                     "per_source": {"a": {"loaded": 1}}, "total": {"loaded": 1}, "drops": {},
                                     "decontamination": {}}))
    params = stage_params("label_verification", overrides={"rl_data": {"max_prompt_tokens": 2048},
                                                           "label_verification": {"enabled": False}})
    assert main(["rl-data", "--params", json.dumps(params), "--data", str(data), "--funnel",
                 str(funnel_in), "--tokenizer", str(folder), "--out", str(tmp_path / "out")]) == 0
    funnel = read_json(tmp_path / "out" / "funnel.json")
    assert funnel["step_status"]["prompt_length"] == "done" and 200 < funnel["prompt_length"]["longest"] < 2048
    assert str(folder) in read_json(tmp_path / "out" / "manifest.json")["inputs"]


def test_a_filter_value_no_row_has_fails_naming_the_value_and_the_columns_values():
    """``one-step`` for ``one_step`` would silently drop a whole kind of problem from a stage's data."""
    from rstar2.data.loaders import load_source

    spec = {"name": "arith", "path": "data/learning/train.jsonl", "fields": {"problem": "problem", "answer": "answer"},
            "filters": {"kind": ["bare", "one-step"]}}
    with pytest.raises(ValueError, match=r"filter kind: value\(s\) \['one-step'\] match no row; the column has "
                                         r"\['bare', 'one_step', 'two_step', 'word'\]"):
        load_source(spec)
    spec["filters"] = {"kind": ["bare", "one_step"]}
    assert {r["id"] for r in load_source(spec)}   # the right spelling loads


def test_a_broken_csv_or_parquet_file_is_named_in_the_error(tmp_path):
    from rstar2.data.loaders import load_source

    bad = tmp_path / "bad.csv"
    bad.write_text('problem,answer\n"what is 1 + 1,2\n')   # a quote that never closes
    with pytest.raises(ValueError, match=r"dataset 'mine' \(file .*bad\.csv\): not a readable CSV file: .*EOF"):
        load_source({"name": "mine", "path": str(bad), "fields": {"problem": "problem", "answer": "answer"}})
    broken = tmp_path / "bad.parquet"
    broken.write_bytes(b"PAR1 not really")
    with pytest.raises(ValueError, match=r"dataset 'mine' \(file .*bad\.parquet\): not a readable parquet file"):
        load_source({"name": "mine", "path": str(broken), "fields": {"problem": "problem", "answer": "answer"}})
