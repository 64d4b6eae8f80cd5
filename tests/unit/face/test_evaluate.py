"""``facefuse face-eval``: detection rate and per-stage figures on a folder of images."""

import argparse
import json

import numpy as np
import pytest
from skimage import data

from facefuse.core.errors import InvalidInput
from facefuse.face import commands
from facefuse.face.evaluate import evaluate_folder, format_report
from facefuse.face.imageio import encode_png


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("faces")
    (root / "a_astronaut.png").write_bytes(encode_png(data.astronaut()))
    noise = np.random.default_rng(0).integers(0, 256, size=(96, 96, 3), dtype=np.uint8)
    (root / "b_noise.png").write_bytes(encode_png(noise))
    (root / "c_broken.jpg").write_bytes(b"\xff\xd8\xff not really a jpeg")
    (root / "notes.txt").write_text("ignored: not an image suffix")
    return root


def _parse(argv):
    parser = argparse.ArgumentParser(prog="facefuse")
    commands.register(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def test_report_counts_hits_misses_and_unreadable_files(folder):
    report = evaluate_folder(folder, ("hog", "haar"))
    assert report.images == 2 and report.detected == 1 and report.rate == 0.5
    assert report.misses == ["b_noise.png"]
    assert list(report.unreadable) == ["c_broken.jpg"]
    assert report.detector_of == {"a_astronaut.png": "hog"}
    hog, haar = report.stages
    assert (hog.name, hog.runs, hog.hits) == ("hog", 2, 1)
    assert (haar.name, haar.runs, haar.hits) == ("haar", 1, 0)  # only the miss reaches it
    assert hog.mean_ms > 0 and haar.mean_ms > 0
    text = format_report(report)
    assert "1/2 faces detected" in text and "b_noise.png" in text


def test_command_prints_json_and_honours_min_rate(folder, capsys):
    args = _parse(["face-eval", str(folder), "--json", "--stages", "hog"])
    assert args.func(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["images"] == 2 and report["detected"] == 1
    assert [s["name"] for s in report["stages"]] == ["hog"]
    assert report["stages"][0]["runs"] == 2
    args = _parse(["face-eval", str(folder), "--stages", "hog", "--min-rate", "0.9"])
    assert args.func(args) == 1
    assert "1/2 faces detected" in capsys.readouterr().out


def test_command_refuses_unknown_stages_and_missing_folders(tmp_path):
    with pytest.raises(SystemExit):
        _parse(["face-eval", str(tmp_path), "--stages", "hog,yolo"])
    args = _parse(["face-eval", str(tmp_path / "absent")])
    with pytest.raises(InvalidInput) as info:
        args.func(args)
    assert info.value.field == "DIR"
