"""Episode summaries: a fact about the job that cannot be read is missing, never an error."""

from nestor.outer.episodes import knobs_changed


def test_knobs_changed_is_none_for_a_config_toml_that_cannot_be_read(tmp_path):
    for text in ("max_steps = " + "9" * 5000 + "\n",  # tomllib raises ValueError on it
                 "x = " + "[" * 3000 + "]" * 3000 + "\n", "max_steps = 0\n"):
        (tmp_path / "config.toml").write_text(text)
        assert knobs_changed(tmp_path, 12, 150_000) is None
    (tmp_path / "config.toml").write_text("max_steps = 7\n")
    assert knobs_changed(tmp_path, 12, 150_000) >= 1
