"""Every role refuses a wrongly typed or unknown-choice variable by its name, from its
meta/argument_specs.yml, before any of its tasks runs (linux-system-roles' tests_invalid_input).

playbooks/invalid-input.yml includes each role once with one bad value, in check mode on this
host, and prints REFUSED or ACCEPTED per case; this test reads those lines.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import yaml
from ansible_support import flat, inventory, playbook

PLAYBOOK = Path(__file__).parent / "playbooks" / "invalid-input.yml"
CASES = yaml.safe_load(PLAYBOOK.read_text())[0]["vars"]["__invalid_cases"]


@pytest.fixture(scope="module")
def output(tmp_path_factory) -> str:
    hosts = {"localhost": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}}
    result = playbook(inventory(tmp_path_factory.mktemp("invalid") / "inventory.yml", hosts), str(PLAYBOOK),
                      "--check", timeout=600)
    assert result.returncode == 0, result.stdout[-4000:]
    return flat(result.stdout)


def test_every_role_has_a_case():
    roles = {path.name for path in (Path(__file__).parents[2] / "ansible" / "roles").iterdir()}
    assert {case["role"] for case in CASES} == roles


@pytest.mark.parametrize("case", CASES, ids=lambda case: f"{case['role']}-{case['var']}")
def test_a_bad_variable_is_refused_by_its_name(output, case):
    role, var, value = case["role"], case["var"], case["value"]
    assert f"ACCEPTED {role} {var}" not in output, f"{role} accepted {var}={value!r}"
    refusal = re.search(rf"REFUSED {role} {var}: (.*?)\"", output)
    assert refusal, f"no refusal line for {role} {var}"
    message = refusal.group(1)
    # The argument spec names the variable and what is wrong with the value.
    assert message.startswith("Validation of arguments failed"), message
    if case["kind"] == "choice":
        assert f"value of {var} must be one of:" in message and f"got: {value}" in message, message
    else:
        assert f"argument '{var}' is of type str and we were unable to convert" in message, message
