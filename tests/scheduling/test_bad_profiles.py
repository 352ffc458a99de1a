"""A profile or calibration file that is not a UTF-8 JSON object fails with one error naming the file and how to
make a good one; a run given one stops with that line before any model loads."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from dspark_bench.cli.main import main
from dspark_bench.scheduling.calibration import CalibrationError, load_temperatures
from dspark_bench.scheduling.profile import ProfileError, load_profile


@pytest.mark.parametrize("text, why", [
    (b'{"target": "x", "dtype": ', "Expecting value: line 1 column 26"),
    (b'{"target": "caf\xe9"}', "can't decode byte 0xe9 in position 15"),
])
def test_a_damaged_profile_or_calibration_names_the_file(tmp_path, text, why):
    path = tmp_path / "file.json"
    path.write_bytes(text)
    with pytest.raises(ProfileError) as err:
        load_profile(path)
    assert str(err.value).startswith(f"{path} is not a readable profile, a UTF-8 JSON object (")
    assert why in str(err.value) and "dspark-bench profile --out" in str(err.value)
    with pytest.raises(CalibrationError) as err:
        load_temperatures(path)
    assert str(err.value).startswith(f"{path} is not a readable calibration file, a UTF-8 JSON object (")
    assert why in str(err.value) and "dspark-bench calibrate" in str(err.value)


def test_a_profile_that_is_not_an_object_says_what_a_profile_is(tmp_path):
    path = tmp_path / "profile.json"
    path.write_text("[1, 2]")
    with pytest.raises(ProfileError, match=r"profile.json: a JSON list; a profile is a JSON object with keys"):
        load_profile(path)


def test_cli_run_reports_a_damaged_profile_in_one_line_before_the_target_loads(tmp_path, monkeypatch):
    from dspark_bench.target.model import Target

    loaded = []
    monkeypatch.setattr(Target, "load", lambda *a, **k: loaded.append(1))
    path = tmp_path / "profile.json"
    path.write_text("{")
    res = CliRunner().invoke(main, ["run", "--drafter", "none", "--scheduler", "hardware-aware", "--profile", str(path),
                                    "--limit", "1", "--max-new-tokens", "4", "--out", str(tmp_path / "run")])
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert res.exit_code == 2 and len(lines) == 1, res.output
    assert lines[0].startswith(f"error: {path} is not a readable profile")
    assert not loaded and not (tmp_path / "run").exists()
