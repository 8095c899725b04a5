"""Reports from a real (tiny) run: PNG plots of the expected size and a Markdown summary with samples."""

import pytest
import toy_env
from matplotlib.image import imread
from tiny import tiny_model, tiny_tokenizer

from comlrl import report
from comlrl.cli import main
from comlrl.errors import ComlrlError


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("report")
    tiny = tmp / "tiny"
    tiny_model().save_pretrained(tiny)
    tiny_tokenizer().save_pretrained(tiny)
    with toy_env.registered():
        rows = toy_env.write_rows(tmp / "rows.jsonl")
        cfg = toy_env.write_config(tmp / "toy.yaml", rows, str(tiny), max_steps=4, eval_steps=2, beta=0.1)
        assert main(["train", cfg, "--set", f"output_dir={tmp / 'run'}", "--set", "report=true"]) == 0
    return tmp / "run"


def test_train_writes_plots_of_the_expected_size(run_dir):
    names = {p.name for p in (run_dir / "report").glob("*.png")}
    assert names == {"reward.png", "levels.png", "length.png", "loss.png"}
    for name in names:
        path = run_dir / "report" / name
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        image = imread(path)
        assert image.shape == (450, 800, 4)  # FIGSIZE x DPI
        assert image[..., :3].std() > 0.01  # not a blank canvas


def test_markdown_summary_links_plots_and_shows_samples(run_dir):
    text = (run_dir / "report.md").read_text()
    assert text.startswith(f"# Run report: {run_dir.name}")
    assert "algorithm: **magrpo**" in text and "environment: **toy-length**" in text and "seed: 3" in text
    for name in ("reward", "levels", "length", "loss"):
        assert f"(report/{name}.png)" in text
    assert "| reward/mean |" in text and "| reward/level/longer |" in text  # before/after table
    assert "## Sample completions (eval-after)" in text and "agent 1:" in text


def test_report_command_rebuilds_the_report(run_dir, capsys):
    (run_dir / "report.md").unlink()
    assert main(["report", str(run_dir)]) == 0
    assert "report.md" in capsys.readouterr().out and (run_dir / "report.md").is_file()


def test_report_on_a_directory_without_metrics(tmp_path):
    with pytest.raises(ComlrlError, match="metrics.jsonl"):
        report.write_report(tmp_path)
    assert main(["report", str(tmp_path)]) == 2


def test_smoothing():
    assert report.smooth([]) == []
    assert report.smooth([2.0] * 5) == pytest.approx([2.0] * 5)  # bias-corrected: no ramp from zero
    s = report.smooth([0.0] * 10 + [1.0] * 10, alpha=0.5)
    assert s[9] == 0.0 and 0.0 < s[10] < s[-1] <= 1.0
