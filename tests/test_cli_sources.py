"""Where p2p start's settings come from (p2p/cli/sources.py): flags over P2P_* variables over
the config file over the defaults, and nothing unknown passes silently."""

import typing

import pytest

from p2p.cli.errors import CliError
from p2p.cli.sources import merge
from p2p.cli.start import start

TYPES = typing.get_type_hints(start)


def write(tmp_path, text):
    path = tmp_path / "swarm.toml"
    path.write_text(text)
    return str(path)


def test_flags_beat_the_environment_which_beats_the_file(tmp_path):
    config = write(tmp_path, 'listen = "127.0.0.1:7000"\nalgorithm = "diloco"\ndiloco_inner_steps = 25\n'
                             'join = ["10.0.0.1:7000"]\nsteps = 100\n')
    env = {"P2P_DILOCO_INNER_STEPS": "40", "P2P_STEPS": "200", "HOME": "/root"}
    merged = merge({"steps": 300, "join": []}, TYPES, config, env)
    assert merged.values["listen"] == "127.0.0.1:7000" and merged.values["algorithm"] == "diloco"  # file
    assert merged.values["diloco_inner_steps"] == "40"  # the environment over the file (its parser takes "auto" too)
    assert merged.values["steps"] == 300  # the flag over both
    assert merged.values["join"] == ["10.0.0.1:7000"]  # an empty list is "no flag given"
    assert merged.where("diloco_inner_steps", "--diloco-inner-steps") == "P2P_DILOCO_INNER_STEPS"
    assert merged.where("algorithm", "--algorithm") == f"{config}: algorithm"
    assert merged.where("steps", "--steps") == "--steps"


def test_environment_strings_become_the_settings_types():
    env = {"P2P_JOIN": "a:1, b:2", "P2P_STATE_SYNC": "false", "P2P_COMM_FRACTION": "0.25", "P2P_SEED": "7"}
    values = merge({}, TYPES, None, env).values
    assert values == {"join": ["a:1", "b:2"], "state_sync": False, "comm_fraction": 0.25, "seed": 7}


@pytest.mark.parametrize("text, words", [
    ('lisen = "127.0.0.1:7000"\n', "unknown key 'lisen'"),
    ("steps = \"many\"\n", "steps = 'many': want an integer"),
    ("join = \"a:1\"\n", "want a list of strings"),
    ("[section]\nx = 1\n", "unknown key 'section'"),
    ("listen = \n", "not TOML"),
])
def test_a_bad_config_file_names_the_key_and_what_to_fix(tmp_path, text, words):
    with pytest.raises(CliError, match=words):
        merge({}, TYPES, write(tmp_path, text), {})


@pytest.mark.parametrize("env, words", [
    ({"P2P_LISEN": "x"}, "P2P_LISEN: no such setting"),
    ({"P2P_STEPS": "many"}, "P2P_STEPS='many': want an integer"),
    ({"P2P_STATE_SYNC": "maybe"}, "want true or false"),
])
def test_a_bad_environment_variable_is_an_error_that_names_it(env, words):
    with pytest.raises(CliError, match=words):
        merge({}, TYPES, None, env)


def test_a_missing_config_file_is_an_error(tmp_path):
    with pytest.raises(CliError, match="--config .*absent.toml"):
        merge({}, TYPES, str(tmp_path / "absent.toml"), {})
