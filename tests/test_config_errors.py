"""One-line config errors (rstar2.config_schema.validate_config): the key path, the real problem, the file."""

import copy
from pathlib import Path

import pytest
import yaml

from rstar2.config_schema import validate_config

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = str(ROOT / "workflow/schemas/config.schema.yaml")
BASE = yaml.safe_load((ROOT / "config.yaml").read_text())


def merged(over: dict) -> dict:
    from rstar2.stages.params import merge_config

    return merge_config(copy.deepcopy(BASE), over)


@pytest.mark.parametrize("over, expected", [
    # a typo inside a "null or object" setting names the typo, not "is not of type 'null'" (helper finding)
    ({"rl": {"stages": {"stage2": {"step": 9}}}}, "config: rl.stages.stage2: Unevaluated properties are not allowed "
                                                  "('step' was unexpected) (set in over.yaml)"),
    ({"label_verification": {"model": {"source": "hub", "hubid": "x"}}},
     "config: label_verification.model: Additional properties are not allowed ('hubid' was unexpected)"),
    # list indices as in the other checks' messages: sources[0], not sources.0
    ({"rl_data": {"sources": [{"name": "a", "path": "a.csv", "fileds": {}}]}},
     "config: rl_data.sources[0]: Additional properties are not allowed ('fileds' was unexpected)"),
    # YAML 1.1 reads 1e-4 as a string
    ({"rl": {"learning_rate": "1e-4"}}, "config: rl.learning_rate: '1e-4' is not of type 'number' (YAML reads 1e-4 "
                                        "as a string: write it with a dot, e.g. 1.0e-4)"),
    # a value of neither allowed type names both types instead of "not valid under any of the given schemas"
    ({"evaluate": {"limit": "3"}}, "config: evaluate.limit: '3' is not of type 'integer' or 'object'"),
])
def test_a_refused_value_is_named_by_its_real_problem(tmp_path, over, expected):
    f = tmp_path / "over.yaml"
    f.write_text(yaml.safe_dump(over))
    with pytest.raises(ValueError) as e:
        validate_config(merged(over), SCHEMA, [str(ROOT / "config.yaml"), str(f)])
    assert str(e.value).replace(str(f), "over.yaml").startswith(expected), str(e.value)


def test_a_number_nested_in_a_config_override_is_named_as_snakemakes_string():
    """Snakemake's --config hands the values inside a mapping over as strings (`--config 'rl={faults:
    {max_infra_share: 0.5}}'`): the error says so and where to set it, not the YAML hint of a config file."""
    over = {"rl": {"faults": {"max_infra_share": "0.5"}}, "hard_problems": {"k": "3"}}
    for key, value, kind in [("rl", over["rl"], "number"), ("hard_problems", over["hard_problems"], "integer")]:
        with pytest.raises(ValueError) as e:
            validate_config(merged({key: value}), SCHEMA, [str(ROOT / "config.yaml"), {key: value}])
        assert str(e.value).endswith(f"is not of type '{kind}' (Snakemake's --config passes the values inside a "
                                     "mapping as strings: set it in a --configfile) (set with --config)"), str(e.value)
